package disktest

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
)

func mount(t testing.TB, size int64) string {
	if os.Geteuid() != 0 {
		t.Fatalf("disktest: this test needs root to mount a size-limited tmpfs; run it as root (sudo -E go test ./...) or in CI")
	}
	dir := filepath.Join(t.TempDir(), "tmpfs")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	opts := "size=" + strconv.FormatInt(size, 10) + ",mode=0700"
	if err := syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, opts); err != nil {
		t.Fatalf("disktest: mount tmpfs on %s: %v (this test needs root, and a kernel that lets it mount tmpfs)", dir, err)
	}
	// Registered after t.TempDir's own clean-up, so it runs before it: the
	// folder is removed once nothing is mounted on it. Detached, so that a
	// file a failed test left open does not keep it mounted.
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("disktest: unmount %s: %v", dir, err)
		}
	})
	return dir
}

func available(t testing.TB, dir string) int64 {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatalf("disktest: statfs %s: %v", dir, err)
	}
	return int64(st.Bavail) * st.Bsize
}

func fill(t testing.TB, dir string, leave int64) func() {
	f, err := os.CreateTemp(dir, ".disktest-fill-*")
	if err != nil {
		t.Fatalf("disktest: fill %s: %v", dir, err)
	}
	name := f.Name()
	defer f.Close()
	take := available(t, dir) - leave
	chunk := make([]byte, 1<<20)
	for take > 0 {
		n := min(int64(len(chunk)), take)
		if _, err := f.Write(chunk[:n]); err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				break // what is left is less than a block
			}
			t.Fatalf("disktest: fill %s: %v", dir, err)
		}
		take -= n
	}
	freed := false
	free := func() {
		if freed {
			return
		}
		freed = true
		if err := os.Remove(name); err != nil {
			t.Errorf("disktest: free %s: %v", dir, err)
		}
	}
	t.Cleanup(free)
	return free
}
