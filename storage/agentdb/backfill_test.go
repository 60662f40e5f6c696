package agentdb

import (
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/calltap/calltap/storage"
)

func TestKnownDeliveryIDs(t *testing.T) {
	db := openAgentDB(t)
	ctx := context.Background()
	var caps []*Capture
	for i := 0; i < 700; i += 2 { // every even delivery id is captured
		caps = append(caps, callCapture(i, "call-1", "call.started", ""))
	}
	if _, err := db.WriteCaptures(ctx, caps, nil); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range 1200 { // more than one chunk of parameters
		ids = append(ids, fmt.Sprintf("d%d", i))
	}
	known, err := db.KnownDeliveryIDs(ctx, ids)
	if err != nil {
		t.Fatal(err)
	}
	if len(known) != 350 {
		t.Fatalf("%d known, want 350", len(known))
	}
	for i := range 1200 {
		if want := i < 700 && i%2 == 0; known[fmt.Sprintf("d%d", i)] != want {
			t.Fatalf("d%d: known %v, want %v", i, !want, want)
		}
	}
	if k, err := db.KnownDeliveryIDs(ctx, nil); err != nil || len(k) != 0 {
		t.Fatalf("no ids: %v %v", k, err)
	}
}

// A lookup that meets a damaged delivery-id index after its first answer
// reports the damage: it never answers "these did not arrive", which
// would make a backfill import again what the store already holds.
func TestKnownDeliveryIDsReportsDamage(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agent.db")
	db := openAgentAt(t, path)
	var caps []*Capture
	for i := range 2000 { // an index of several pages: d-0 on the first, d-999 on the last
		caps = append(caps, testCapture(i, []byte(`{}`)))
	}
	saveCaptures(t, db, caps...)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	// The index's last page: the right-most child of its root (an
	// interior page, type 2, its child pointer at bytes 8-11).
	file, err := sql.Open("sqlite3", "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	var root, pageSize int64
	err = file.QueryRow(`SELECT rootpage FROM sqlite_master WHERE name = 'captures_delivery'`).Scan(&root)
	if err == nil {
		err = file.QueryRow(`PRAGMA page_size`).Scan(&pageSize)
	}
	file.Close()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	head := raw[(root-1)*pageSize:]
	if head[0] != 2 {
		t.Fatalf("the index's root page is of type %d, not an interior page", head[0])
	}
	last := int64(binary.BigEndian.Uint32(head[8:12]))
	overwrite(t, path, (last-1)*pageSize, pageSize)

	db = openAgentAt(t, path)
	known, err := db.KnownDeliveryIDs(ctx, []string{"d-0", "d-999"})
	if !errors.Is(err, storage.ErrDamaged) {
		t.Fatalf("lookup through a damaged index: %v, %v; want ErrDamaged", known, err)
	}
}
