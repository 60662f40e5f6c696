package intake

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// A segment held by its writer is not removed; once let go, it is.
func TestRemoveUnheld(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.seg")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := HoldSegment(f); err != nil {
		t.Fatal(err)
	}
	if removed, err := RemoveUnheld(path); removed || err != nil {
		t.Fatalf("a held segment: removed %v, %v", removed, err)
	}
	f.Close()
	if removed, err := RemoveUnheld(path); !removed || err != nil {
		t.Fatalf("a segment let go: removed %v, %v", removed, err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("still there: %v", err)
	}
	if _, err := RemoveUnheld(path); err == nil {
		t.Error("removed a segment that does not exist")
	}
}

// A released span reads as zeros and takes no blocks, rounded up to
// whole blocks; the file keeps its size.
func TestReleaseSpan(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.seg")
	data := make([]byte, 16*directAlign)
	for i := range data {
		data[i] = 1
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(path)
	before := Allocated(fi)
	if err := ReleaseSpan(path, 4*directAlign, 4*directAlign-100); err != nil {
		t.Fatal(err)
	}
	fi, _ = os.Stat(path)
	got, _ := os.ReadFile(path)
	if fi.Size() != int64(len(data)) {
		t.Fatalf("size %d after a release", fi.Size())
	}
	for i, b := range got {
		if want := byte(1); i >= 4*directAlign && i < 8*directAlign {
			want = 0
			if b != want {
				t.Fatalf("byte %d is %d after the release", i, b)
			}
		} else if b != want {
			t.Fatalf("byte %d outside the span is %d", i, b)
		}
	}
	if after := Allocated(fi); after != before-4*directAlign {
		t.Errorf("allocated %d after the release, want %d", after, before-4*directAlign)
	}
	// A span of whole blocks is released as it is, not a block more.
	if err := ReleaseSpan(path, 10*directAlign, 2*directAlign); err != nil {
		t.Fatal(err)
	}
	got, _ = os.ReadFile(path)
	if got[10*directAlign] != 0 || got[12*directAlign-1] != 0 || got[12*directAlign] != 1 {
		t.Errorf("a release of 2 blocks at block 10: bytes %d %d %d", got[10*directAlign], got[12*directAlign-1], got[12*directAlign])
	}
	if err := ReleaseSpan(filepath.Join(t.TempDir(), "missing"), 0, 1); err == nil {
		t.Error("released a span of a missing segment")
	}
}

// preallocate gives blocks without writing, and refuses what would leave
// less than as much again free.
func TestPreallocate(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "a.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := preallocate(f, 1<<20); err != nil {
		t.Fatal(err)
	}
	fi, _ := f.Stat()
	if fi.Size() != 1<<20 || Allocated(fi) < 1<<20 {
		t.Errorf("size %d, allocated %d, want 1 MiB", fi.Size(), Allocated(fi))
	}
	var st syscall.Statfs_t
	if err := syscall.Fstatfs(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	free := int64(st.Bavail) * int64(st.Bsize)
	if err := preallocate(f, free/2+free/8); err != syscall.ENOSPC {
		t.Errorf("more than half the free space: %v, want ENOSPC", err)
	}
}
