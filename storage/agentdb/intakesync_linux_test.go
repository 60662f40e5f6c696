package agentdb

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/calltap/calltap/storage"
)

// failSyncOnce makes the log's next append reach its file and then points
// the file's descriptor at a pipe until undo: an fdatasync of the log in
// between fails (EINVAL), so an append that syncs is refused and one that
// does not goes through. undo gives the file its descriptor back.
func failSyncOnce(t *testing.T, disk *faultDisk) (undo func()) {
	t.Helper()
	var p [2]int
	if err := syscall.Pipe(p[:]); err != nil {
		t.Fatal(err)
	}
	armed, fd, saved := true, -1, -1
	disk.setWriteAt(func(f *os.File, b []byte, off int64) (int, error) {
		n, err := f.WriteAt(b, off)
		if err != nil || !armed {
			return n, err
		}
		armed, fd = false, int(f.Fd())
		if saved, err = syscall.Dup(fd); err != nil {
			t.Error(err)
		} else if err := syscall.Dup3(p[1], fd, 0); err != nil {
			t.Error(err)
		}
		return n, nil
	})
	return func() {
		if saved >= 0 {
			if err := syscall.Dup3(saved, fd, 0); err != nil {
				t.Fatal(err)
			}
			syscall.Close(saved)
		}
		syscall.Close(p[0])
		syscall.Close(p[1])
		disk.setWriteAt(nil)
	}
}

// Under SyncFull a batch with inserts is synced before LogCaptures returns
// (a sync that fails refuses it), and a batch of updates alone is not;
// under SyncNormal nothing is.
func TestIntakeSyncsInsertsOnly(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	fullDisk, normalDisk := &faultDisk{}, &faultDisk{}
	full := openIntakeDB(t, filepath.Join(dir, "full.db"), withDisk(fullDisk))
	defer full.Close()
	c := testCapture(1, []byte(`{"n":1}`))
	undo := failSyncOnce(t, fullDisk)
	_, err := full.LogCaptures(ctx, []*Capture{c}, nil)
	undo()
	if err == nil || !strings.Contains(err.Error(), "sync the intake log") {
		t.Fatalf("SyncFull, an insert whose sync fails: %v, want it refused", err)
	}
	if _, err := full.LogCaptures(ctx, []*Capture{c}, nil); err != nil {
		t.Fatal(err)
	}
	undo = failSyncOnce(t, fullDisk)
	_, err = full.LogCaptures(ctx, nil, []*Capture{answeredCapture(c)})
	undo()
	if err != nil {
		t.Errorf("SyncFull, updates alone: %v, want them taken without a sync", err)
	}

	normal := openIntakeDB(t, filepath.Join(dir, "normal.db"), WithSync(storage.SyncNormal), withDisk(normalDisk))
	defer normal.Close()
	undo = failSyncOnce(t, normalDisk)
	_, err = normal.LogCaptures(ctx, []*Capture{testCapture(2, []byte(`{"n":2}`))}, nil)
	undo()
	if err != nil {
		t.Errorf("SyncNormal, an insert: %v, want it taken without a sync", err)
	}
}
