package intake

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

// Request bodies of BodyMin bytes or more are kept out of the database,
// appended to segment files in a folder beside the store (agentdb.BodiesDir,
// which the intake log shares); capture_bodies keeps an empty body, the
// segment's name and the offset.
//
// On disk: a segment is <folder>/<name>, the name made by newSegmentName
// (<unix ns, 16 hex digits>-<6 random bytes in hex>.seg: a listing is in
// the order they were started, and two processes never share one). Each body starts
// at an offset that is a multiple of directAlign (4096) and is padded with
// zeros to the next one; nothing else is in the file, so a body is found
// only by its segment, offset and size, as the database records them.
//
// In the database, a 1 MiB body is 256 page writes into the WAL, then the
// checkpoint's copy of each page into the database: two buffered writes of
// every byte. On the machine the benchmarks run on, buffered writes of
// fresh data are what saving large bodies is bound by (each page-cache page
// is zeroed, then copied, and writeback does not keep up: sustained, ~2.8 ms
// a MiB). In a segment a body is written once, with O_DIRECT where the file
// system takes it (bodyfile_linux.go): the bytes go to the device without
// the page cache (~0.25 ms a MiB there). Segments, not a file per body:
// creating a file cost as much as writing 1 MiB into it.
//
// A store's Bodies appends to a segment of its own (another process on the
// same store has its own), each body at an offset aligned for O_DIRECT,
// and starts a new segment past segmentMax. Appends run side by side: each
// reserves its span under a lock and writes it unlocked, so the agent
// writes large bodies from the goroutines that received them (agentdb's StageBody)
// rather than one at a time in its writer, each waiting for the device.
// A body is written before the transaction that records it commits, so a
// committed capture always has its body; a crash in between, or a failed
// transaction, leaves bytes that no capture names, which nothing reads.
//
// Under SyncFull, a commit is durable when it returns, so the segments a
// transaction names must be on stable storage before it commits: O_DIRECT
// takes the bytes past the page cache, not past the device's own cache,
// nor does it make the file's new size durable. Each append marks its
// segment written; the writer syncs every segment written since its last
// commit once, just before the next (SyncWritten), so a batch of bodies
// costs one sync per segment, as a batch of captures costs one of the WAL.
// A new segment's name is made durable by syncing the folder when it is
// created. Under SyncNormal segments are not synced, as the WAL is not:
// an application crash loses neither, a power cut may.

const (
	// BodyMin is the size from which a body goes to a segment.
	BodyMin    = 256 << 10
	segmentMax = 1 << 30 // a segment takes no new body past this size
)

// SegmentPath is the file of segment name in the folder dir. Names are
// made here (newSegmentName); one read from the database that could leave
// the folder is refused.
func SegmentPath(dir, name string) (string, error) {
	if name == "" || strings.ContainsAny(name, `/\`) || name == "." || name == ".." {
		return "", fmt.Errorf("storage: %q cannot name a body segment", name)
	}
	return filepath.Join(dir, name), nil
}

// newSegmentName names a segment: time first, so that a listing is in the
// order they were started, then random, so that two processes never share
// one.
func newSegmentName() string {
	var r [6]byte
	rand.Read(r[:]) // never fails (crypto/rand)
	return fmt.Sprintf("%016x-%s.seg", time.Now().UnixNano(), hex.EncodeToString(r[:]))
}

// KeptApart reports whether a body of n bytes is kept in a segment rather
// than in the database.
func KeptApart(n int) bool { return n >= BodyMin }

// Bodies is where a store's large bodies are appended.
type Bodies struct {
	dir    string // the folder (agentdb.BodiesDir)
	synced bool   // storage.SyncFull: segments are synced before a commit names their bodies
	disk   Disk   // syncs the segments: OSDisk, unless a test gave another (WithDisk)

	syncMu sync.Mutex // held by SyncWritten: a second call waits for the first's syncs

	mu       sync.Mutex
	name     string            // guarded by mu: the segment appended to; "" before the first
	f        *os.File          // guarded by mu: its file, open for writing (O_DIRECT where possible)
	size     int64             // guarded by mu: its next free offset, a multiple of directAlign
	files    []*os.File        // guarded by mu: every segment opened, closed by close (appends to a full one may still be running)
	buffered bool              // guarded by mu: O_DIRECT refused a write here; segments are plain files from then on
	written  map[*os.File]bool // guarded by mu: segments appended to since the last SyncWritten (when synced)
}

// NewBodies is the body store in folder dir, synced before commits if
// synced.
func NewBodies(dir string, synced bool, opts ...Option) *Bodies {
	return &Bodies{dir: dir, synced: synced, disk: newConfig(opts).disk, written: map[*os.File]bool{}}
}

// ErrSegmentSync marks a failed sync of segments: what was written to them
// may not be on the device, and a later sync may not say so again.
var ErrSegmentSync = errors.New("storage: sync body segments")

// SyncWritten syncs every segment appended to since it last ran. A
// segment it cannot sync is written to no more.
func (bs *Bodies) SyncWritten() error {
	if !bs.synced {
		return nil
	}
	bs.syncMu.Lock()
	defer bs.syncMu.Unlock()
	bs.mu.Lock()
	files := make([]*os.File, 0, len(bs.written))
	for f := range bs.written {
		files = append(files, f)
	}
	clear(bs.written)
	bs.mu.Unlock()
	for _, f := range files {
		if err := bs.disk.Sync(f); err != nil {
			bs.mu.Lock()
			if bs.f == f {
				bs.f = nil // the next append starts a new segment
			}
			bs.mu.Unlock()
			return fmt.Errorf("%w: %s: %w", ErrSegmentSync, filepath.Base(f.Name()), err)
		}
	}
	return nil
}

// SyncDir makes the names of the segments in the folder durable.
func (bs *Bodies) SyncDir() error {
	d, err := os.Open(bs.dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return bs.disk.Sync(d)
}

// reserve returns a span of n bytes (a multiple of directAlign) in the
// current segment, starting a new one if this one is full.
func (bs *Bodies) reserve(n int64) (name string, f *os.File, off int64, err error) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	if bs.f == nil || (bs.size > 0 && bs.size+n > segmentMax) {
		if err := bs.startSegment(); err != nil {
			return "", nil, 0, err
		}
	}
	off = bs.size
	bs.size += n
	return bs.name, bs.f, off, nil
}

// startSegment opens a new segment to append to. Guarded by mu.
func (bs *Bodies) startSegment() error {
	if err := os.MkdirAll(bs.dir, 0o700); err != nil {
		return fmt.Errorf("storage: body folder: %w", err)
	}
	name := newSegmentName()
	f, err := openSegment(filepath.Join(bs.dir, name), !bs.buffered)
	if err != nil {
		return fmt.Errorf("storage: start a body segment: %w", err)
	}
	bs.files = append(bs.files, f)
	if err := HoldSegment(f); err != nil {
		return fmt.Errorf("storage: hold a body segment: %w", err)
	}
	if bs.synced {
		if err := bs.SyncDir(); err != nil {
			return fmt.Errorf("storage: sync the body folder: %w", err)
		}
	}
	bs.name, bs.f, bs.size = name, f, 0
	return nil
}

// Append writes body to a segment and returns which and where.
func (bs *Bodies) Append(body []byte) (string, int64, error) {
	for retried := false; ; retried = true {
		name, f, off, err := bs.reserve(int64((len(body) + directAlign - 1) &^ (directAlign - 1)))
		if err != nil {
			return "", 0, err
		}
		_, err = writeAligned(f, off, body)
		if err == nil {
			if bs.synced {
				bs.mu.Lock()
				bs.written[f] = true
				bs.mu.Unlock()
			}
			return name, off, nil
		}
		if !errors.Is(err, syscall.EINVAL) || retried {
			return "", 0, fmt.Errorf("storage: write body to segment %s: %w", name, err)
		}
		// The device wants O_DIRECT writes aligned beyond directAlign:
		// plain files from now on, starting with a new segment.
		bs.mu.Lock()
		if !bs.buffered {
			bs.buffered = true
			bs.f = nil
		}
		bs.mu.Unlock()
	}
}

func (bs *Bodies) Close() error {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	var errs []error
	for _, f := range bs.files {
		errs = append(errs, f.Close())
	}
	bs.files, bs.f, bs.name = nil, nil, ""
	return errors.Join(errs...)
}

// writeAligned writes body at offset off of f (a multiple of directAlign),
// through aligned buffers, a chunk at a time, the last one padded with
// zeros to directAlign; it returns the bytes written, padding included.
func writeAligned(f *os.File, off int64, body []byte) (int64, error) {
	bp := directBufs.Get().(*[]byte)
	defer directBufs.Put(bp)
	buf := *bp
	var written int64
	for pos := 0; pos < len(body); pos += directChunk {
		n := copy(buf, body[pos:])
		padded := (n + directAlign - 1) &^ (directAlign - 1)
		clear(buf[n:padded])
		if _, err := f.WriteAt(buf[:padded], off+written); err != nil {
			return written, err
		}
		written += int64(padded)
	}
	return written, nil
}

// ReadBody reads the size bytes at offset in segment name of the folder dir.
func ReadBody(dir, name string, offset, size int64) ([]byte, error) {
	var r SegmentReader
	defer r.Close()
	return r.Read(dir, name, offset, size)
}

// SegmentReader reads bodies from segments, keeping the last file open:
// for a run of reads, most from one file, one open instead of one each.
type SegmentReader struct {
	name string
	f    *os.File
}

func (r *SegmentReader) Read(dir, name string, offset, size int64) ([]byte, error) {
	if r.f == nil || r.name != name {
		r.Close()
		path, err := SegmentPath(dir, name)
		if err != nil {
			return nil, err
		}
		if r.f, err = os.Open(path); err != nil {
			return nil, fmt.Errorf("storage: body segment: %w", err)
		}
		r.name = name
	}
	body := make([]byte, size)
	if _, err := r.f.ReadAt(body, offset); err != nil && !(errors.Is(err, io.EOF) && size == 0) {
		return nil, fmt.Errorf("storage: body in segment %s at %d: %w", name, offset, err)
	}
	return body, nil
}

func (r *SegmentReader) Close() {
	if r.f != nil {
		r.f.Close()
		r.f, r.name = nil, ""
	}
}

// directChunk is the size of the aligned buffers O_DIRECT writes go
// through: a body is copied into one and written a chunk at a time.
const directChunk = 1 << 20

// directAlign is what O_DIRECT needs buffers, offsets and lengths aligned
// to: the logical block size, 4096 or a divisor of it on the file systems
// calltap runs on.
const directAlign = 4096

// directBufs holds *[]byte of directChunk bytes, aligned to directAlign.
var directBufs = sync.Pool{New: func() any {
	b := make([]byte, directChunk+directAlign)
	off := int(uintptr(unsafe.Pointer(&b[0])) & (directAlign - 1))
	if off != 0 {
		off = directAlign - off
	}
	b = b[off : off+directChunk : off+directChunk]
	return &b
}}
