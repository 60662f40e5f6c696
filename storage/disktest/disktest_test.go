package disktest_test

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/calltap/calltap/storage/disktest"
)

// A filled folder refuses a write larger than what was left, and takes it
// once the space is freed.
func TestFillRefusesThenFrees(t *testing.T) {
	dir := disktest.Dir(t, 8<<20)
	free := disktest.Fill(t, dir, 1<<20)
	if got := disktest.Free(t, dir); got > 1<<20 || got < 1<<20-64<<10 {
		t.Fatalf("free after Fill(1 MiB) = %d", got)
	}
	big := make([]byte, 2<<20)
	path := filepath.Join(dir, "big")
	if err := os.WriteFile(path, big, 0o600); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("writing 2 MiB with 1 MiB free: %v, want ENOSPC", err)
	}
	free()
	if err := os.WriteFile(path, big, 0o600); err != nil {
		t.Fatalf("writing 2 MiB after free: %v", err)
	}
}
