package intake

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// frames is the frames of payloads, one after another.
func frames(payloads ...string) []byte {
	var b []byte
	for _, p := range payloads {
		b, _ = AppendFrame(b, func(b []byte) []byte { return append(b, p...) })
	}
	return b
}

// newTestLog is a synced log in a new folder, appending to generation 1.
func newTestLog(t *testing.T, opts ...Option) *Log {
	t.Helper()
	dirSyncs := 0
	l := NewLog(t.TempDir(), true, func() error { dirSyncs++; return nil }, opts...)
	if err := l.Start(1); err != nil {
		t.Fatal(err)
	}
	if dirSyncs != 1 {
		t.Fatalf("starting a synced log synced the folder %d times, want 1", dirSyncs)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// A frame is its payload's length and CRC-32C, little endian, then the
// payload: the layout the package comment gives.
func TestFrameLayout(t *testing.T) {
	b, payload := AppendFrame([]byte("x"), func(b []byte) []byte { return append(b, "hello"...) })
	if string(payload) != "hello" || len(b) != 1+8+5 {
		t.Fatalf("frame %q, payload %q", b, payload)
	}
	if n := binary.LittleEndian.Uint32(b[1:]); n != 5 {
		t.Errorf("length %d, want 5", n)
	}
	if sum := binary.LittleEndian.Uint32(b[5:]); sum != 0x9a71bb4c { // CRC-32C("hello")
		t.Errorf("checksum %#x, want CRC-32C %#x", sum, 0x9a71bb4c)
	}
	if n, ok := FrameAt(b, 1); !ok || n != 5 {
		t.Errorf("FrameAt: %d, %v", n, ok)
	}
	for name, bad := range map[string][]byte{
		"short header":  b[:1+7],
		"short payload": b[:len(b)-1],
		"zero length":   append(append([]byte{0}, 0, 0, 0, 0), b[5:]...),
		"bad checksum":  append(append([]byte(nil), b[:len(b)-1]...), 'O'),
	} {
		if _, ok := FrameAt(bad, 1); ok {
			t.Errorf("%s: a frame", name)
		}
	}
	huge := make([]byte, 16)
	binary.LittleEndian.PutUint32(huge, MaxRecord+1)
	if _, ok := FrameAt(huge, 0); ok {
		t.Error("a frame claiming more than MaxRecord")
	}
}

// The log's file names sort by generation, and Files finds only them.
func TestFilesAndNames(t *testing.T) {
	dir := t.TempDir()
	if Name(42) != "intake-0000000000000042.log" {
		t.Fatalf("Name(42) = %q", Name(42))
	}
	for _, n := range []string{Name(10), Name(9), Name(100), LockName, "intake-x.log", "intake-7.seg", "other-1.log"} {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	gens, err := Files(dir)
	if err != nil || len(gens) != 3 || gens[0] != 9 || gens[1] != 10 || gens[2] != 100 {
		t.Fatalf("Files: %v, %v", gens, err)
	}
	if _, err := Files(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a missing folder: %v", err)
	}
}

// Appends go at the end, in zeros made ahead; ReadLog gives them back,
// each with the offset past its frame, and stops at the zeros.
func TestAppendAndRead(t *testing.T) {
	l := newTestLog(t)
	if l.Reserved() != FileMax {
		t.Fatalf("reserved %d, want %d", l.Reserved(), FileMax)
	}
	for _, batch := range [][]string{{"a", "bb"}, {"ccc"}} {
		if err := l.Append(frames(batch...), true); err != nil {
			t.Fatal(err)
		}
	}
	gen, end := l.End()
	if gen != 1 || end != 3*8+6 || l.Gen() != 1 {
		t.Fatalf("end %d:%d", gen, end)
	}
	s, err := ReadLog(l.Path(1), 0)
	if err != nil {
		t.Fatal(err)
	}
	if s.Cut != -1 || s.Size != FileMax || s.End != end || len(s.Records) != 3 {
		t.Fatalf("scan %+v", s)
	}
	for i, want := range []struct {
		payload string
		end     int64
	}{{"a", 9}, {"bb", 19}, {"ccc", 30}} {
		if r := s.Records[i]; string(r.Payload) != want.payload || r.End != want.end {
			t.Errorf("record %d: %q ending %d, want %q ending %d", i, r.Payload, r.End, want.payload, want.end)
		}
	}
	// From a later offset: only what follows.
	if s, err := ReadLog(l.Path(1), 19); err != nil || len(s.Records) != 1 || string(s.Records[0].Payload) != "ccc" {
		t.Errorf("from 19: %+v, %v", s, err)
	}
	if _, err := ReadLog(l.Path(2), 0); err == nil {
		t.Error("read a log that does not exist")
	}
}

// stubDisk writes and syncs through its functions where a test set them,
// and as OSDisk does where not.
type stubDisk struct {
	writeAt func(f *os.File, b []byte, off int64) (int, error)
	sync    func(f *os.File) error
}

func (d *stubDisk) WriteAt(f *os.File, b []byte, off int64) (int, error) {
	if d.writeAt != nil {
		return d.writeAt(f, b, off)
	}
	return OSDisk{}.WriteAt(f, b, off)
}

func (d *stubDisk) Sync(f *os.File) error {
	if d.sync != nil {
		return d.sync(f)
	}
	return OSDisk{}.Sync(f)
}

// A failed write is taken back: zeros again where the file had them, and
// the next append goes where the failed one began.
func TestFailedAppendTakenBack(t *testing.T) {
	disk := &stubDisk{}
	l := newTestLog(t, WithDisk(disk))
	if err := l.Append(frames("first"), true); err != nil {
		t.Fatal(err)
	}
	_, before := l.End()
	disk.writeAt = func(f *os.File, b []byte, off int64) (int, error) {
		n, _ := f.WriteAt(b[:len(b)/2], off)
		return n, syscall.ENOSPC
	}
	if err := l.Append(frames("second", "third"), true); !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), "append to the intake log") {
		t.Fatalf("a full disk: %v", err)
	}
	if _, end := l.End(); end != before {
		t.Fatalf("end %d after a failed append, want %d", end, before)
	}
	data, err := os.ReadFile(l.Path(1))
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(data)) != FileMax || !bytes.Equal(data[before:before+64], make([]byte, 64)) {
		t.Fatalf("after the failed append: %d bytes, %q at the end", len(data), data[before:before+64])
	}
	disk.writeAt = nil
	if err := l.Append(frames("fourth"), true); err != nil {
		t.Fatal(err)
	}
	s, _ := ReadLog(l.Path(1), 0)
	if len(s.Records) != 2 || string(s.Records[1].Payload) != "fourth" {
		t.Errorf("records %+v", s.Records)
	}
}

// unwrite past the reserved zeros cuts the file back.
func TestUnwritePastReserve(t *testing.T) {
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, Name(1)))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	l := NewLog(dir, false, nil)
	l.use(f, 1, 16)
	if _, err := f.WriteAt(make([]byte, 16), 0); err != nil {
		t.Fatal(err)
	}
	l.size = 8
	if _, err := f.WriteAt(bytes.Repeat([]byte{7}, 24), 8); err != nil {
		t.Fatal(err)
	}
	if err := l.unwrite(24); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(f.Name())
	if !bytes.Equal(data, make([]byte, 16)) {
		t.Errorf("after unwrite: %v, want the 16 reserved zeros", data)
	}
	// Without a reserve: cut at size.
	l.reserved = 0
	if _, err := f.WriteAt([]byte("abc"), 8); err != nil {
		t.Fatal(err)
	}
	if err := l.unwrite(8); err != nil {
		t.Fatal(err)
	}
	if fi, _ := f.Stat(); fi.Size() != 8 {
		t.Errorf("size %d after unwrite without a reserve, want 8", fi.Size())
	}
}

// Past 7/8 of the file, the next append goes to a new generation, made
// ahead from half way; the file left is synced, and Close closes both.
func TestMakeRoomRotates(t *testing.T) {
	l := newTestLog(t)
	if err := l.MakeRoom(); err != nil || l.preparing || l.Gen() != 1 {
		t.Fatalf("an empty log: %v, preparing %v, gen %d", err, l.preparing, l.Gen())
	}
	l.size = FileMax / 2
	if err := l.MakeRoom(); err != nil || !l.preparing || l.Gen() != 1 {
		t.Fatalf("half full: %v, preparing %v, gen %d", err, l.preparing, l.Gen())
	}
	l.size = FileMax * 7 / 8
	l.unsynced = true
	if err := l.MakeRoom(); err != nil || l.preparing || l.Gen() != 2 || l.unsynced {
		t.Fatalf("7/8 full: %v, preparing %v, gen %d, unsynced %v", err, l.preparing, l.Gen(), l.unsynced)
	}
	if _, end := l.End(); end != 0 {
		t.Errorf("the new file starts at %d", end)
	}
	// Not made ahead: Rotate makes it.
	if err := l.Rotate(); err != nil || l.Gen() != 3 {
		t.Fatalf("rotate: %v, gen %d", err, l.Gen())
	}
	gens, _ := Files(l.dir)
	if len(gens) != 3 {
		t.Errorf("files %v", gens)
	}
	l.size = FileMax / 2
	l.MakeRoom() // makes 4 ahead
	if err := l.Close(); err != nil || l.preparing {
		t.Errorf("close: %v, preparing %v", err, l.preparing)
	}
}

// A log made on a folder where the file cannot be created says so.
func TestStartFails(t *testing.T) {
	l := NewLog(filepath.Join(t.TempDir(), "missing"), false, nil)
	if err := l.Start(1); err == nil {
		t.Fatal("started a log in a missing folder")
	}
	dir := t.TempDir()
	l = NewLog(dir, true, func() error { return syscall.EIO })
	if err := l.Start(1); !errors.Is(err, syscall.EIO) {
		t.Fatalf("a folder that cannot be synced: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, Name(1))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the file not made ready stays: %v", err)
	}
}

// The files made ahead and rotated to are the next generations, in order.
func TestRotationGenerations(t *testing.T) {
	l := newTestLog(t)
	l.size = FileMax / 2
	l.MakeRoom()
	l.size = FileMax * 7 / 8
	if err := l.MakeRoom(); err != nil {
		t.Fatal(err)
	}
	if err := l.Rotate(); err != nil {
		t.Fatal(err)
	}
	gens, _ := Files(l.dir)
	if len(gens) != 3 || gens[0] != 1 || gens[1] != 2 || gens[2] != 3 || l.Gen() != 3 {
		t.Fatalf("generations %v, appending to %d", gens, l.Gen())
	}
	for _, g := range gens[1:] {
		if fi, err := os.Stat(l.Path(g)); err != nil || fi.Size() != FileMax {
			t.Errorf("log %d: %v, %v", g, fi, err)
		}
	}
}

// prefill writes exactly n zeros, in chunks.
func TestPrefill(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "z"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.WriteAt(bytes.Repeat([]byte{9}, 3<<20), 0)
	n := int64(1<<21 + 5)
	if err := prefill(f, n); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(f.Name())
	if !bytes.Equal(got[:n], make([]byte, n)) || got[n] != 9 {
		t.Errorf("prefill of %d: zeros to %d, then %d", n, bytes.IndexByte(got, 9), got[n])
	}
}

// unwrite of bytes that end exactly at the reserve writes zeros and cuts
// nothing; one from the reserve's end cuts back to it.
func TestUnwriteAtReserveEnd(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), Name(1)))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	l := NewLog(filepath.Dir(f.Name()), false, nil)
	l.use(f, 1, 32)
	f.WriteAt(bytes.Repeat([]byte{7}, 32), 0)
	l.size = 16
	if err := l.unwrite(16); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(f.Name())
	if len(got) != 32 || !bytes.Equal(got[16:], make([]byte, 16)) || got[15] != 7 {
		t.Fatalf("after unwrite to the reserve's end: %v", got)
	}
	f.WriteAt(bytes.Repeat([]byte{7}, 8), 32)
	l.size = 32
	if err := l.unwrite(8); err != nil {
		t.Fatal(err)
	}
	if fi, _ := f.Stat(); fi.Size() != 32 {
		t.Errorf("size %d after unwrite past the reserve, want 32", fi.Size())
	}
}

// A log never started closes cleanly; a rotation closes the file left.
func TestCloseFiles(t *testing.T) {
	if err := NewLog(t.TempDir(), false, nil).Close(); err != nil {
		t.Errorf("closing a log never started: %v", err)
	}
	l := newTestLog(t)
	old := l.f
	if err := l.Rotate(); err != nil {
		t.Fatal(err)
	}
	if _, err := old.Write([]byte("x")); !errors.Is(err, os.ErrClosed) {
		t.Errorf("the file left by a rotation: write %v, want it closed", err)
	}
}
