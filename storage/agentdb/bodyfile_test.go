package agentdb

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// Bodies of fileBodyMin bytes and more are kept in files: byte-exact
// through every read of the store, found by text search when they are
// text, and never in the database itself. Smaller ones stay in it.
func TestLargeBodiesInFiles(t *testing.T) {
	ctx := context.Background()
	db := openAgentDB(t)
	binary := bytes.Repeat([]byte{0xff, 0x00, 0x80, 'x'}, fileBodyMin/4+1001) // not UTF-8, not a multiple of 4096
	text := fmt.Appendf(nil, `{"call":{"call_id":"call-0"},"notes":"%s Zanzibar"}`, bytes.Repeat([]byte("lorem "), fileBodyMin/6))
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
		if large := len(c.Body) >= fileBodyMin; large {
			fi, err := os.Stat(filepath.Join(BodiesDir(db.path), file.String))
			if !file.Valid || stored != 0 || offset.Int64%directAlign != 0 || err != nil || fi.Size() < offset.Int64+int64(len(c.Body)) {
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

// A segment gives back every body appended to it, whatever its size
// against O_DIRECT's blocks and the chunks it is written in, and a full
// segment is followed by a new one.
func TestSegmentAppend(t *testing.T) {
	seg := &bodyStore{dir: filepath.Join(t.TempDir(), "agent-bodies")}
	defer seg.close()
	type at struct {
		name   string
		offset int64
		body   []byte
	}
	var saved []at
	for _, n := range []int{1, directAlign - 1, directAlign, directChunk, directChunk + 1, 3*directChunk + 4097, 0, 17} {
		body := make([]byte, n)
		for i := range body {
			body[i] = byte(i*31 + n)
		}
		name, off, err := seg.append(body)
		if err != nil {
			t.Fatalf("%d bytes: %v", n, err)
		}
		if off%directAlign != 0 {
			t.Errorf("%d bytes at offset %d, not aligned", n, off)
		}
		saved = append(saved, at{name, off, body})
	}
	seg.size = segmentMax // as if full
	name, off, err := seg.append([]byte("next"))
	if err != nil || name == saved[0].name || off != 0 {
		t.Errorf("after a full segment: %q at %d, %v (first was %q)", name, off, err, saved[0].name)
	}
	saved = append(saved, at{name, off, []byte("next")})
	for _, s := range saved {
		got, err := readBody(seg.dir, s.name, s.offset, int64(len(s.body)))
		if err != nil || !bytes.Equal(got, s.body) {
			t.Errorf("%d bytes at %s:%d: read back %d bytes, %v", len(s.body), s.name, s.offset, len(got), err)
		}
	}
	for _, bad := range []string{"", "..", "../agent.db", `a\b`} {
		if _, err := readBody(seg.dir, bad, 0, 1); err == nil {
			t.Errorf("segment name %q was read", bad)
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
		cs[i] = testCapture(i, bytes.Repeat([]byte{byte(i), 0xff}, fileBodyMin/2+i*1001))
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
