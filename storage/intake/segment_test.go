package intake

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"unsafe"
)

// A body is kept apart from BodyMin bytes on.
func TestKeptApart(t *testing.T) {
	if KeptApart(BodyMin-1) || !KeptApart(BodyMin) || !KeptApart(BodyMin+1) {
		t.Errorf("KeptApart around BodyMin: %v %v %v", KeptApart(BodyMin-1), KeptApart(BodyMin), KeptApart(BodyMin+1))
	}
}

// Bodies follow each other at offsets rounded up to O_DIRECT's blocks; a
// segment takes bodies up to segmentMax, then the next starts a new one.
func TestSegmentSpans(t *testing.T) {
	bs := NewBodies(t.TempDir(), false)
	defer bs.Close()
	var offs []int64
	for _, n := range []int{1, directAlign, directAlign + 1, 5} {
		_, off, err := bs.Append(make([]byte, n))
		if err != nil {
			t.Fatal(err)
		}
		offs = append(offs, off)
	}
	if want := []int64{0, directAlign, 2 * directAlign, 4 * directAlign}; !equal(offs, want) {
		t.Fatalf("offsets %v, want %v", offs, want)
	}
	name, _, _ := bs.Append([]byte("x"))
	// Room for exactly one more block: it goes in this segment.
	bs.size = segmentMax - directAlign
	same, off, err := bs.Append([]byte("y"))
	if err != nil || same != name || off != segmentMax-directAlign {
		t.Fatalf("the last block: %s at %d, %v (segment %s)", same, off, err, name)
	}
	next, off, err := bs.Append([]byte("z"))
	if err != nil || next == name || off != 0 {
		t.Fatalf("past a full segment: %s at %d, %v", next, off, err)
	}
}

func equal(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// A synced store syncs each segment written since the last SyncWritten
// once, and a new segment's folder when it starts one; a segment that
// fails to sync takes no more bodies. An unsynced store syncs nothing.
func TestSegmentSyncs(t *testing.T) {
	var synced []string
	fail := false
	bs := NewBodies(t.TempDir(), true, WithDisk(&stubDisk{sync: func(f *os.File) error {
		synced = append(synced, filepath.Base(f.Name()))
		if fail {
			return syscall.EIO
		}
		return nil
	}}))
	defer bs.Close()
	first, _, err := bs.Append([]byte("a"))
	if err != nil {
		t.Fatal(err)
	}
	if len(synced) != 1 || synced[0] != filepath.Base(bs.dir) {
		t.Fatalf("a new segment synced %v, want its folder", synced)
	}
	bs.Append([]byte("b"))
	synced = nil
	if err := bs.SyncWritten(); err != nil || len(synced) != 1 || synced[0] != first {
		t.Fatalf("SyncWritten synced %v (%v), want %s once", synced, err, first)
	}
	synced = nil
	if err := bs.SyncWritten(); err != nil || len(synced) != 0 {
		t.Fatalf("with nothing written: synced %v (%v)", synced, err)
	}
	bs.Append([]byte("c"))
	fail = true
	if err := bs.SyncWritten(); !errors.Is(err, ErrSegmentSync) || !errors.Is(err, syscall.EIO) {
		t.Fatalf("a failed sync: %v", err)
	}
	fail = false
	if next, _, err := bs.Append([]byte("d")); err != nil || next == first {
		t.Fatalf("after a failed sync: %s (%v), want a new segment", next, err)
	}

	plain := NewBodies(t.TempDir(), false, WithDisk(&stubDisk{sync: func(*os.File) error {
		t.Error("an unsynced store synced")
		return nil
	}}))
	defer plain.Close()
	plain.Append([]byte("e"))
	if err := plain.SyncWritten(); err != nil {
		t.Fatal(err)
	}
}

// A reader keeps the last segment open and moves to another when asked;
// a body past the end is an error, an empty one is not.
func TestSegmentReader(t *testing.T) {
	bs := NewBodies(t.TempDir(), false)
	defer bs.Close()
	a, aoff, _ := bs.Append([]byte("first"))
	bs.size = segmentMax
	b, boff, _ := bs.Append([]byte("second"))
	var r SegmentReader
	defer r.Close()
	for _, want := range []struct {
		name string
		off  int64
		body string
	}{{a, aoff, "first"}, {b, boff, "second"}, {a, aoff, "first"}, {a, aoff, "fir"}} {
		got, err := r.Read(bs.dir, want.name, want.off, int64(len(want.body)))
		if err != nil || string(got) != want.body {
			t.Fatalf("%s:%d: %q, %v", want.name, want.off, got, err)
		}
	}
	if got, err := r.Read(bs.dir, a, directAlign, 0); err != nil || len(got) != 0 {
		t.Errorf("an empty body at the end: %q, %v", got, err)
	}
	if _, err := r.Read(bs.dir, a, directAlign, 1); err == nil {
		t.Error("read past the end of a segment")
	}
	if _, err := r.Read(bs.dir, "missing.seg", 0, 1); err == nil {
		t.Error("read a segment that does not exist")
	}
	r.Close()
	r.Close()
	if r.f != nil || r.name != "" {
		t.Error("Close left the file")
	}
}

// The buffers O_DIRECT writes go through are aligned, a chunk long.
func TestDirectBuffersAligned(t *testing.T) {
	for range 4 {
		bp := directBufs.New().(*[]byte)
		if p := uintptr(unsafe.Pointer(&(*bp)[0])); p%directAlign != 0 || len(*bp) != directChunk || cap(*bp) != directChunk {
			t.Fatalf("buffer at %#x, %d long (cap %d)", p, len(*bp), cap(*bp))
		}
	}
}

// A body longer than a chunk is written whole, in chunks, padded to a
// block: what writeAligned returns is the bytes the file took.
func TestWriteAligned(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "seg"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	body := bytes.Repeat([]byte("0123456789"), (directChunk+100)/10)
	n, err := writeAligned(f, 0, body)
	if want := int64(directChunk + directAlign); err != nil || n != want {
		t.Fatalf("wrote %d (%v), want %d", n, err, want)
	}
	got := make([]byte, n)
	f.ReadAt(got, 0)
	if !bytes.Equal(got[:len(body)], body) || !bytes.Equal(got[len(body):], make([]byte, int(n)-len(body))) {
		t.Error("body or padding wrong")
	}
	if n, err := writeAligned(f, 0, nil); n != 0 || err != nil {
		t.Errorf("an empty body: %d, %v", n, err)
	}
}
