package agentdb

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/calltap/calltap/storage/intake"
)

// Bodies of intake.BodyMin bytes and more are kept in files: byte-exact
// through every read of the store, found by text search when they are
// text, and never in the database itself. Smaller ones stay in it.
func TestLargeBodiesInFiles(t *testing.T) {
	ctx := context.Background()
	db := openAgentDB(t)
	binary := bytes.Repeat([]byte{0xff, 0x00, 0x80, 'x'}, intake.BodyMin/4+1001) // not UTF-8, not a multiple of 4096
	text := fmt.Appendf(nil, `{"call":{"call_id":"call-0"},"notes":"%s Zanzibar"}`, bytes.Repeat([]byte("lorem "), intake.BodyMin/6))
	small := []byte(`{"city":"Denver"}`)
	cs := []*Capture{testCapture(0, binary), testCapture(1, text), testCapture(2, small)}
	saveCaptures(t, db, cs...)
	for i, c := range cs {
		got, err := db.Capture(ctx, c.ID)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Body, c.Body) || got.Size != len(c.Body) {
			t.Errorf("capture %d: body of %d bytes back, want %d byte-exact", i, len(got.Body), len(c.Body))
		}
		var stored int64
		var file sql.NullString
		var offset sql.NullInt64
		if err := db.read.QueryRowContext(ctx, `SELECT length(body), file, file_offset FROM capture_bodies WHERE seq = ?`, c.Seq).Scan(&stored, &file, &offset); err != nil {
			t.Fatal(err)
		}
		if large := len(c.Body) >= intake.BodyMin; large {
			fi, err := os.Stat(filepath.Join(BodiesDir(db.path), file.String))
			if !file.Valid || stored != 0 || offset.Int64%4096 != 0 /* O_DIRECT's alignment */ || err != nil || fi.Size() < offset.Int64+int64(len(c.Body)) {
				t.Errorf("capture %d (%d bytes): in %q at %d, %d bytes in the database, %v", i, len(c.Body), file.String, offset.Int64, stored, err)
			}
		} else if file.Valid || stored != int64(len(c.Body)) {
			t.Errorf("capture %d (%d bytes): in %q, %d bytes in the database", i, len(c.Body), file.String, stored)
		}
	}
	if got := searchIDs(t, db, "Zanzibar"); len(got) != 1 || got[0] != cs[1].ID {
		t.Errorf("search in a body kept in a file: %v", got)
	}
	calls, err := db.CallCaptures(ctx, "call-0")
	if err != nil || len(calls["call-0"]) != 3 {
		t.Fatalf("call-0: %d captures, %v", len(calls["call-0"]), err)
	}
	for i, c := range calls["call-0"] {
		if !bytes.Equal(c.Body, cs[i].Body) {
			t.Errorf("call timeline, capture %d: body of %d bytes, want %d", i, len(c.Body), len(cs[i].Body))
		}
	}
}

// Bodies staged side by side, from many goroutines, land in spans of their
// own, and the captures that name them read back whole.
func TestStageBodiesSideBySide(t *testing.T) {
	ctx := context.Background()
	db := openAgentDB(t)
	cs := make([]*Capture, 16)
	errs := make(chan error, len(cs))
	for i := range cs {
		cs[i] = testCapture(i, bytes.Repeat([]byte{byte(i), 0xff}, intake.BodyMin/2+i*1001))
		go func(c *Capture) { errs <- db.StageBody(c) }(cs[i])
	}
	for range cs {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.WriteCaptures(ctx, cs, nil); err != nil {
		t.Fatal(err)
	}
	for i, c := range cs {
		got, err := db.Capture(ctx, c.ID)
		if err != nil || !bytes.Equal(got.Body, c.Body) {
			t.Errorf("capture %d: %d bytes back, want %d, %v", i, len(got.Body), len(c.Body), err)
		}
	}
}
