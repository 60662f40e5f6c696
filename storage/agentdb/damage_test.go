package agentdb

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/calltap/calltap/storage"
	"github.com/calltap/calltap/storage/intake"
)

// savedStore makes a closed agent store at dir/agent.db holding n captures
// with ~2 KB bodies (one of them large enough for a segment) and an index
// that has caught up, and returns its path.
func savedStore(t *testing.T, dir string, n int) string {
	t.Helper()
	ctx := context.Background()
	path := filepath.Join(dir, "agent.db")
	db, err := OpenAgent(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	var batch []*Capture
	for i := range n {
		body := fmt.Sprintf(`{"city":"Denver","lead_id":"L-%d","notes":%q}`, i, strings.Repeat("lorem ipsum dolor sit amet ", 70))
		batch = append(batch, testCapture(i, []byte(body)))
	}
	batch[0].Body = bytes.Repeat([]byte("Denver "), intake.BodyMin/7+1)
	if _, err := db.WriteCaptures(ctx, batch, nil); err != nil {
		t.Fatal(err)
	}
	if err := db.CatchUpSearch(ctx); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// overwrite writes garbage over the file at path from byte off on, n bytes.
func overwrite(t *testing.T, path string, off, n int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(bytes.Repeat([]byte{0x5a}, int(n)), off); err != nil {
		t.Fatal(err)
	}
}

// A store emptied to zero bytes beside the files it left (its search index,
// its body segments) is refused, naming the file and what to do, and the
// files beside it are left as they were.
func TestOpenRefusesEmptiedStore(t *testing.T) {
	path := savedStore(t, t.TempDir(), 10)
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	index, err := os.Stat(SearchIndexPath(path))
	if err != nil {
		t.Fatal(err)
	}
	db, err := OpenAgent(context.Background(), path)
	if err == nil {
		db.Close()
		t.Fatal("an emptied agent.db was opened as a new store")
	}
	if !errors.Is(err, storage.ErrDamaged) {
		t.Errorf("error %v is not ErrDamaged", err)
	}
	for _, want := range []string{path, "0 bytes", "backup", "move the data directory aside"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() != 0 {
		t.Errorf("agent.db after the refusal: %v, %v", fi, err)
	}
	if fi, err := os.Stat(SearchIndexPath(path)); err != nil || fi.Size() != index.Size() {
		t.Errorf("the search index after the refusal: %v, %v", fi, err)
	}
}

// A data directory with no store, or only an empty agent.db and nothing of
// it beside (a first start that stopped before SQLite wrote a page), is a
// new store.
func TestOpenAcceptsNewStore(t *testing.T) {
	ctx := context.Background()
	fresh := filepath.Join(t.TempDir(), "data", "agent.db")
	db, err := OpenAgent(ctx, fresh)
	if err != nil {
		t.Fatal(err)
	}
	db.Close()

	touched := filepath.Join(t.TempDir(), "agent.db")
	if err := os.WriteFile(touched, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	db, err = OpenAgent(ctx, touched)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.WriteCaptures(ctx, []*Capture{testCapture(1, []byte(`{}`))}, nil); err != nil {
		t.Fatal(err)
	}

	relayPath := filepath.Join(t.TempDir(), "relay.db")
	if err := os.WriteFile(relayPath, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	rdb, err := openOther(ctx, relayPath)
	if err != nil {
		t.Fatal(err)
	}
	rdb.Close()
}

// A search index that is not a database any more is rebuilt at Open, and
// searches find what they found before.
func TestOpenRebuildsUnreadableSearchIndex(t *testing.T) {
	path := savedStore(t, t.TempDir(), 50)
	overwrite(t, SearchIndexPath(path), 0, 4096)
	db := openAgentAt(t, path)
	if got := searchIDs(t, db, "L-42"); len(got) != 1 {
		t.Fatalf("search after the rebuild: %v", got)
	}
	if _, count, err := db.Captures(context.Background(), CaptureFilter{Text: "Denver", Page: Page{Limit: 5}}); err != nil || count != 50 {
		t.Fatalf("search after the rebuild: %d matches, %v", count, err)
	}
}

// A search index damaged inside is found by the search that reads the
// damage: it is reported as the index's, with what to do, and the next
// Open has a rebuilt index that answers.
func TestDamagedSearchIndexRebuiltOnReopen(t *testing.T) {
	ctx := context.Background()
	path := savedStore(t, t.TempDir(), 200)
	// Every page but the first (the schema) and the position's, which Open
	// reads: the damage is met by the search.
	idx, err := sql.Open("sqlite3", "file:"+SearchIndexPath(path)+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	var root, pageSize, pages int64
	err = idx.QueryRow(`SELECT rootpage FROM sqlite_master WHERE name = 'search_progress'`).Scan(&root)
	if err == nil {
		err = idx.QueryRow(`PRAGMA page_size`).Scan(&pageSize)
	}
	if err == nil {
		err = idx.QueryRow(`PRAGMA page_count`).Scan(&pages)
	}
	idx.Close()
	if err != nil {
		t.Fatal(err)
	}
	for p := int64(2); p <= pages; p++ {
		if p != root {
			overwrite(t, SearchIndexPath(path), (p-1)*pageSize, pageSize)
		}
	}
	db, err := OpenAgent(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = db.Captures(ctx, CaptureFilter{Text: "Denver", Page: Page{Limit: 5}})
	db.Close()
	if !errors.Is(err, storage.ErrDamaged) {
		t.Fatalf("search of a damaged index: %v, want ErrDamaged", err)
	}
	for _, want := range []string{SearchIndexPath(path), "rebuilds it"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	db = openAgentAt(t, path)
	if _, count, err := db.Captures(ctx, CaptureFilter{Text: "Denver", Page: Page{Limit: 5}}); err != nil || count != 200 {
		t.Fatalf("search after reopening: %d matches, %v", count, err)
	}
}

// Pages overwritten in the middle of agent.db give, at Open or at the
// first listing, an error that names the file and says how to recover
// what it holds.
func TestDamagedStoreExplained(t *testing.T) {
	ctx := context.Background()
	path := savedStore(t, t.TempDir(), 2000)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	overwrite(t, path, fi.Size()/4, fi.Size()/2)
	db, err := OpenAgent(ctx, path)
	if err == nil {
		defer db.Close()
		_, _, err = db.Captures(ctx, CaptureFilter{Page: Page{Limit: 50}})
	}
	if !errors.Is(err, storage.ErrDamaged) {
		t.Fatalf("listing a damaged store: %v, want ErrDamaged", err)
	}
	for _, want := range []string{path, "sqlite3 " + path + " .recover"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}
