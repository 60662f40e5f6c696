package intakelock

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/calltap/calltap/storage/intake"
)

// Held answers from the kernel's list of locks, whoever holds the
// lock, and leaves no file open behind it: a reader asks at every open.
func TestIntakeOwnedLeavesNoFileOpen(t *testing.T) {
	dir := t.TempDir()
	lock, err := os.Create(filepath.Join(dir, intake.LockName))
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	openFiles := func() int {
		t.Helper()
		fds, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(fds)
	}
	before := openFiles()
	const asks = 100
	for range asks {
		if !Held(dir) {
			t.Fatal("a held intake lock is not reported")
		}
	}
	// Other tests' goroutines may hold a few files for a moment; a leak
	// holds one per question.
	if grew := openFiles() - before; grew >= asks/2 {
		t.Fatalf("%d questions left %d more files open", asks, grew)
	}
	if err := lock.Close(); err != nil {
		t.Fatal(err)
	}
	if Held(dir) {
		t.Fatal("a released intake lock is reported held")
	}
}
