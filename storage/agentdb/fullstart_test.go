package agentdb

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/calltap/calltap/storage/disktest"
)

// searchFreePages is the index file's pages on its freelist: what a
// vacuum gives back.
func searchFreePages(t *testing.T, db *AgentStore) int {
	t.Helper()
	var n int
	if err := db.read.QueryRow(`PRAGMA search.freelist_count`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// The store opens on a disk with next to no room left, as the chaos run's
// agent did when it was killed and started again on its full disk: giving
// the index's free pages back is a tidy-up, skipped with one warning, and
// the store reads back what it holds; the next prune gives them back.
// (Before, the open failed, and the agent with it: "incremental vacuum of
// search: database or disk is full"; seen failing so with 64 to 96 KiB
// left.) 80 KiB: SQLite needs 64 KiB to open the store and its index at
// all (each one's WAL index, the -shm file, takes 32 KiB), and the vacuum
// of this index more than 96.
func TestOpenOnAFullDiskSkipsTheVacuum(t *testing.T) {
	for _, stop := range []string{"kill", "orderly"} {
		t.Run(stop, func(t *testing.T) {
			ctx := context.Background()
			dir := disktest.Dir(t, 48<<20)
			path := filepath.Join(dir, "agent.db")
			db := openIntakeDB(t, path)
			kept := saveAndDelete(t, db, 2000, 1500)
			if searchFreePages(t, db) == 0 {
				t.Fatal("the deletes left the index no free pages: the test needs the vacuum to have work")
			}
			if stop == "kill" {
				crash(t, db)
			} else if err := db.Close(); err != nil {
				t.Fatal(err)
			}
			free := disktest.Fill(t, dir, 80<<10)
			log := captureLog(t)
			db, err := OpenAgent(ctx, path, WithIntake())
			if err != nil {
				t.Fatalf("open with 80 KiB free: %v", err)
			}
			defer db.Close()
			if n := countCaptures(t, db); n != len(kept) {
				t.Errorf("%d captures on the full disk, want the %d kept", n, len(kept))
			}
			if got, err := db.Capture(ctx, kept[0].ID); err != nil || string(got.Body) != string(kept[0].Body) {
				t.Errorf("a capture on the full disk: %v", err)
			}
			if _, n, err := db.Captures(ctx, CaptureFilter{Text: "word1999", Page: Page{Limit: 10}}); err != nil || n != 1 {
				t.Errorf("a search on the full disk: %d found, %v", n, err)
			}
			if lines := log.lines("the search index keeps its free pages"); len(lines) != 1 {
				t.Errorf("warnings of the skipped vacuum: %q, want one", lines)
			}
			free()
			if _, err := db.Prune(ctx, Retention{}, capT0); err != nil {
				t.Fatal(err)
			}
			if n := searchFreePages(t, db); n != 0 {
				t.Errorf("%d free pages in the index after a prune with room again, want none", n)
			}
		})
	}
}

// saveAndDelete saves n indexed captures, deletes the oldest del of them,
// and returns the others.
func saveAndDelete(t *testing.T, db *AgentStore, n, del int) []*Capture {
	t.Helper()
	ctx := context.Background()
	var all []*Capture
	for i := range n {
		all = append(all, testCapture(i, []byte(fmt.Sprintf(`{"n":%d,"text":"%s word%d"}`, i, strings.Repeat("lorem ipsum dolor ", 50), i))))
	}
	for i := 0; i < n; i += 100 {
		saveCaptures(t, db, all[i:min(i+100, n)]...)
	}
	if err := db.CatchUpSearch(ctx); err != nil {
		t.Fatal(err)
	}
	ids := make([]string, del)
	for i, c := range all[:del] {
		ids[i] = c.ID
	}
	if _, err := db.DeleteCaptures(ctx, ids...); err != nil {
		t.Fatal(err)
	}
	return all[del:]
}

// A new index file is converted to incremental auto_vacuum at open, with
// room on the disk: a prune can give its pages back a few at a time.
func TestNewSearchIndexIsIncremental(t *testing.T) {
	db := openAgentAt(t, filepath.Join(t.TempDir(), "agent.db"))
	var mode int
	if err := db.read.QueryRow(`PRAGMA search.auto_vacuum`).Scan(&mode); err != nil || mode != 2 {
		t.Fatalf("the new index's auto_vacuum is %d (%v), want 2 (incremental)", mode, err)
	}
}
