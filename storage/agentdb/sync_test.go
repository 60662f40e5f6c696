package agentdb

import (
	"bytes"
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/calltap/calltap/storage"
	"github.com/calltap/calltap/storage/intake"
)

// synchronous is w's PRAGMA synchronous: 1 NORMAL, 2 FULL.
func synchronous(t *testing.T, w *sql.DB) int {
	t.Helper()
	var n int
	if err := w.QueryRowContext(context.Background(), `PRAGMA synchronous`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Commits are synced by default (synchronous=FULL on the write
// connection), and only at checkpoints with SyncNormal; for every schema.
func TestSyncModeOfWriter(t *testing.T) {
	ctx := context.Background()
	for _, mode := range []storage.SyncMode{"", storage.SyncFull, storage.SyncNormal} {
		want := 2
		if mode == storage.SyncNormal {
			want = 1
		}
		var aopts []Option
		var oopts []storage.Option
		if mode != "" {
			aopts, oopts = []Option{WithSync(mode)}, []storage.Option{storage.WithSync(mode)}
		}
		db, err := OpenAgent(ctx, filepath.Join(t.TempDir(), "agent.db"), aopts...)
		if err != nil {
			t.Fatal(err)
		}
		// The capture writer's own connection.
		if _, err := db.WriteCaptures(ctx, []*Capture{testCapture(1, []byte(`{}`))}, nil); err != nil {
			t.Fatal(err)
		}
		if got := synchronous(t, db.write); got != want || (got == 2) != (db.SyncMode() == storage.SyncFull) {
			t.Errorf("agent store opened with mode %q: synchronous = %d (mode %s), want %d", mode, got, db.SyncMode(), want)
		}
		db.Close()
		odb, err := openOther(ctx, filepath.Join(t.TempDir(), "other.db"), oopts...)
		if err != nil {
			t.Fatal(err)
		}
		if got := synchronous(t, odb.Writer()); got != want || (got == 2) != (odb.SyncMode() == storage.SyncFull) {
			t.Errorf("other store opened with mode %q: synchronous = %d (mode %s), want %d", mode, got, odb.SyncMode(), want)
		}
		odb.Close()
	}
	if _, err := OpenAgent(ctx, filepath.Join(t.TempDir(), "agent.db"), WithSync("sometimes")); err == nil {
		t.Error("opened with an unknown sync mode")
	}
}

// watchSyncs records the files db's body store syncs, and whether the
// capture with id was visible to a reader at each sync.
func watchSyncs(t *testing.T, disk *faultDisk, db *AgentStore, id string) (synced func() map[string]bool) {
	mu := sync.Mutex{}
	seen := map[string]bool{}
	disk.setSync(func(f *os.File) error {
		var n int
		if err := db.read.QueryRow(`SELECT count(*) FROM captures WHERE id = ?`, id).Scan(&n); err != nil {
			t.Error(err)
		} else if n != 0 {
			t.Errorf("%s synced after the capture naming it committed", f.Name())
		}
		mu.Lock()
		seen[filepath.Base(f.Name())] = true
		mu.Unlock()
		return f.Sync()
	})
	return func() map[string]bool {
		mu.Lock()
		defer mu.Unlock()
		return seen
	}
}

// A large body's segment, and the folder that names it, are synced before
// the transaction that records the body commits, whether the body was
// staged or written by the writer; with SyncNormal they are not.
func TestSegmentsSyncedBeforeCommit(t *testing.T) {
	ctx := context.Background()
	big := bytes.Repeat([]byte("x"), intake.BodyMin)
	for _, staged := range []bool{false, true} {
		disk := &faultDisk{}
		db := openAgentAt(t, filepath.Join(t.TempDir(), "agent.db"), withDisk(disk))
		c := testCapture(1, big)
		synced := watchSyncs(t, disk, db, c.ID)
		if staged {
			if err := db.StageBody(c); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := db.WriteCaptures(ctx, []*Capture{c}, nil); err != nil {
			t.Fatal(err)
		}
		if c.bodyFile == "" {
			t.Fatal("the body was not kept in a segment")
		}
		got := synced()
		if !got[c.bodyFile] || !got[filepath.Base(BodiesDir(db.path))] {
			t.Errorf("staged=%v: synced %v, want the segment %s and the folder", staged, got, c.bodyFile)
		}
		// A commit that names no new body syncs nothing again.
		clear(got)
		if _, err := db.WriteCaptures(ctx, []*Capture{testCapture(2, []byte(`{}`))}, nil); err != nil {
			t.Fatal(err)
		}
		if got := synced(); len(got) != 0 {
			t.Errorf("synced %v for a commit without a large body", got)
		}
	}

	disk := &faultDisk{}
	db, err := OpenAgent(ctx, filepath.Join(t.TempDir(), "agent.db"), WithSync(storage.SyncNormal), withDisk(disk))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	c := testCapture(1, big)
	synced := watchSyncs(t, disk, db, c.ID)
	if _, err := db.WriteCaptures(ctx, []*Capture{c}, nil); err != nil {
		t.Fatal(err)
	}
	if got := synced(); len(got) != 0 {
		t.Errorf("SyncNormal synced %v", got)
	}
}

// The intake log's apply, unsynced under SyncFull, leaves the write
// connection of a SyncNormal store as it was: NORMAL, not FULL.
func TestApplyKeepsTheSyncMode(t *testing.T) {
	ctx := context.Background()
	for mode, want := range map[storage.SyncMode]int{storage.SyncNormal: 1, storage.SyncFull: 2} {
		db := openIntakeDB(t, filepath.Join(t.TempDir(), "agent.db"), WithSync(mode))
		if _, err := db.LogCaptures(ctx, []*Capture{testCapture(1, []byte(`{}`))}, nil); err != nil {
			t.Fatal(err)
		}
		if err := db.intake.catchUp(ctx); err != nil {
			t.Fatal(err)
		}
		if got := synchronous(t, db.write); got != want {
			t.Errorf("%s: synchronous = %d after an apply, want %d", mode, got, want)
		}
		db.Close()
	}
}
