// Package intake is the agent's files beside its database: the intake log
// (this file, frame.go, scan.go), the body segments (bodyfile.go) and
// reserve files (reserve.go: room set aside while there is some). It
// deals in opaque payloads and bytes; what a record means (a capture's
// fields) is storage/agentdb's.
//
// # The intake log on disk
//
// Files: <folder>/intake-<generation>.log, the generation in 16 decimal
// digits (Name); records are appended to the newest. A file is made ahead
// of its turn as FileMax bytes of zeros on blocks the file system has
// allocated (reserve), so that an append overwrites blocks already the
// file's and its fdatasync writes the data alone; a file past FileMax*7/8
// takes no new record. The folder also holds the lock file (LockName),
// held exclusively by the one process that appends.
//
// Each record is one frame:
//
//	u32 length of the payload (little endian), 1..MaxRecord
//	u32 CRC-32C (Castagnoli) of the payload (little endian)
//	payload
//
// The records end where the rest of the file is zeros, or where it ends:
// a zero length ends them. A frame before that whose length or checksum
// does not hold is damage (ReadLog).
//
// What is synced when: under a synced log, Append fdatasyncs the file
// when asked (the agent asks for a batch holding new captures, and the
// caller is told only after it); a batch not synced then is synced before
// the next file is started (Rotate), so a record in a newer file is never
// on disk while one in an older file is not. A new file, and its name in
// the folder, are synced before a record goes into it. So a record torn by
// a crash with no whole record after it, in its file or a newer one, was
// never synced: nobody was told it was saved, and it may be cut (CutTorn).
// Damage with a whole record after it is damage to a synced record
// (DamageError).
package intake

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

const (
	// FileMax is the bytes of zeros a log file is made with; a file past
	// 7/8 of it takes no new record.
	FileMax = 8 << 20
	// Prefix starts the name of every intake log file.
	Prefix = "intake-"
	// LockName is the log folder's lock file.
	LockName = Prefix + "lock"
)

// Files lists the generations of the log files in dir, oldest first.
func Files(dir string) ([]int64, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("storage: intake folder: %w", err)
	}
	var gens []int64
	for _, e := range entries {
		name, isLog := strings.CutSuffix(e.Name(), ".log")
		num, isIntake := strings.CutPrefix(name, Prefix)
		if !isLog || !isIntake {
			continue
		}
		g, err := strconv.ParseInt(num, 10, 64)
		if err != nil {
			continue
		}
		gens = append(gens, g)
	}
	sort.Slice(gens, func(i, j int) bool { return gens[i] < gens[j] })
	return gens, nil
}

// Name is the file name of generation gen's log.
func Name(gen int64) string { return fmt.Sprintf("%s%016d.log", Prefix, gen) }

// Log is the log file appended to, in its folder. Its methods are called
// with the owner's lock held (agentdb's intake mu), but for the goroutine
// PrepareNext starts, which hands its file over on nextFile.
type Log struct {
	dir     string
	sync    bool         // fdatasync the files (storage.SyncFull)
	syncDir func() error // syncs the folder, making a new file's name durable

	f         *os.File      // the file appended to
	gen       int64         // its generation
	size      int64         // its length: where the next frame goes
	reserved  int64         // bytes of zeros it was made with (reserve); 0 if none
	unsynced  bool          // records were appended to it since its last sync (Rotate syncs them)
	preparing bool          // a goroutine prefills generation gen+1's file, to hand it over on nextFile
	nextFile  chan prepared // capacity 1

	disk Disk // writes the frames: OSDisk, unless a test gave another (WithDisk)
}

// NewLog is the log of folder dir, fdatasynced if sync; syncDir syncs the
// folder. No file is open until Start.
func NewLog(dir string, sync bool, syncDir func() error, opts ...Option) *Log {
	return &Log{dir: dir, sync: sync, syncDir: syncDir, nextFile: make(chan prepared, 1), disk: newConfig(opts).disk}
}

// Path is the file of generation gen.
func (l *Log) Path(gen int64) string { return filepath.Join(l.dir, Name(gen)) }

// Gen is the generation appended to.
func (l *Log) Gen() int64 { return l.gen }

// End is where the next frame goes: the generation and offset.
func (l *Log) End() (gen, off int64) { return l.gen, l.size }

// Reserved is the bytes of zeros the file appended to was made with.
func (l *Log) Reserved() int64 { return l.reserved }

// Start makes generation gen's file the one appended to.
func (l *Log) Start(gen int64) error {
	f, reserved, err := l.makeFile(gen)
	if err != nil {
		return err
	}
	l.use(f, gen, reserved)
	return nil
}

// use makes f, generation gen's file with reserved bytes of zeros made
// ahead, the one appended to.
func (l *Log) use(f *os.File, gen, reserved int64) {
	if l.f != nil {
		l.f.Close()
	}
	l.f, l.gen, l.size, l.reserved, l.unsynced = f, gen, 0, reserved, false
}

// prepared is a log file made ahead of its turn.
type prepared struct {
	f        *os.File
	reserved int64
	err      error
}

// MakeRoom readies the log for an append: past half the file it starts
// making the next one (prepareNext), and past 7/8 it moves to it (past the
// prefilled zeros, each sync would also change the file's size).
func (l *Log) MakeRoom() error {
	if l.size >= FileMax/2 {
		l.prepareNext()
	}
	if l.size >= FileMax*7/8 {
		return l.Rotate()
	}
	return nil
}

// prepareNext starts making the next generation's file while the current
// one still has room, so that the append that fills it does not wait for
// 8 MiB of zeros and their sync.
func (l *Log) prepareNext() {
	if l.preparing {
		return
	}
	l.preparing = true
	gen := l.gen + 1
	go func() {
		f, reserved, err := l.makeFile(gen)
		l.nextFile <- prepared{f, reserved, err}
	}()
}

// Rotate moves appends to the next generation's file: the one prepared
// ahead (waiting for it if it is still being made), else a new one.
//
// The file left is synced first (under a synced log): a batch appended
// without a sync must never be behind a record in a newer file that is on
// disk. The start relies on that: damage with a whole record after it, in
// any file, is damage to a record that was synced.
func (l *Log) Rotate() error {
	if l.sync && l.unsynced {
		// Not tried again if it fails: after a failed sync the pages'
		// state is past knowing (Append), and a log that could never
		// move on would refuse every request.
		l.unsynced = false
		if err := syscall.Fdatasync(int(l.f.Fd())); err != nil {
			return fmt.Errorf("storage: sync the intake log: %w", err)
		}
	}
	if !l.preparing {
		return l.Start(l.gen + 1)
	}
	p := <-l.nextFile
	l.preparing = false
	if p.err != nil {
		return p.err
	}
	l.use(p.f, l.gen+1, p.reserved)
	return nil
}

// makeFile creates generation gen's file, ready to append to, and returns
// how many bytes of zeros it holds ahead of the appends (reserve). Under a
// synced log the folder is synced, so that the new name is durable before
// a record in it is. A file it fails to make ready is removed.
func (l *Log) makeFile(gen int64) (*os.File, int64, error) {
	path := l.Path(gen)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, 0, fmt.Errorf("storage: intake log: %w", err)
	}
	reserved := reserve(f, FileMax)
	// Held while appended to: a delete of every capture it names leaves
	// it be (RemoveUnheld).
	err = HoldSegment(f)
	if err == nil && l.sync {
		err = l.syncDir()
	}
	if err != nil {
		f.Close()
		os.Remove(path)
		return nil, 0, fmt.Errorf("storage: intake log: %w", err)
	}
	return f, reserved, nil
}

// reserve makes f, an empty file, n bytes of zeros on blocks the file
// system has allocated to it, and returns n; 0 if there is not the room
// for it (preallocate), and f is left empty. An append then overwrites
// blocks already the file's, so its fdatasync writes the data alone;
// appending past the end changes the file's size, and each sync also
// commits the file system's journal (a third slower). The blocks are
// allocated first, without writing them: a disk without the room refuses
// at once, and the zeros that follow cannot fill it. A zero length ends
// the records (ReadLog).
func reserve(f *os.File, n int64) int64 {
	if preallocate(f, n) != nil {
		f.Truncate(0) // blocks a refused allocation may have left
		return 0
	}
	if prefill(f, n) != nil {
		f.Truncate(0)
		return 0
	}
	return n
}

// prefill writes n zero bytes to f and syncs it.
func prefill(f *os.File, n int64) error {
	zeros := make([]byte, 1<<20)
	for off := int64(0); off < n; off += int64(len(zeros)) {
		if _, err := f.WriteAt(zeros[:min(int64(len(zeros)), n-off)], off); err != nil {
			return err
		}
	}
	return f.Sync()
}

// Append writes buf, whole frames, at the end of the file, and
// fdatasyncs the file if sync (and the log is synced). A failed write or
// sync takes back what it wrote (unwrite); should that fail too, or the
// sync fail (after which the file's pages are in a state no later sync
// reports truly), the next append starts a new file.
func (l *Log) Append(buf []byte, sync bool) error {
	if _, err := l.disk.WriteAt(l.f, buf, l.size); err != nil {
		l.takeBack(int64(len(buf)))
		return fmt.Errorf("storage: append to the intake log: %w", err)
	}
	if l.sync && sync {
		if err := syscall.Fdatasync(int(l.f.Fd())); err != nil {
			l.takeBack(int64(len(buf)))
			l.size, l.unsynced = FileMax, false
			return fmt.Errorf("storage: sync the intake log: %w", err)
		}
	}
	l.size += int64(len(buf))
	l.unsynced = !sync
	return nil
}

// takeBack unwrites n bytes written at the end; should that fail, the next
// append starts a new file.
func (l *Log) takeBack(n int64) {
	if l.unwrite(n) != nil {
		l.size = FileMax
	}
}

// unwrite takes back n bytes written at size: zeros again where the file
// had them reserved, cut off past that (which needs no room on a full
// disk).
func (l *Log) unwrite(n int64) error {
	if end := min(l.size+n, l.reserved); end > l.size {
		if _, err := l.f.WriteAt(make([]byte, end-l.size), l.size); err != nil {
			return err
		}
	}
	if l.size+n > l.reserved {
		return l.f.Truncate(max(l.size, l.reserved))
	}
	return nil
}

// Close closes the file appended to, and one made ahead and never used:
// an empty log, which the next open finds empty and deletes.
func (l *Log) Close() error {
	if l.preparing {
		if p := <-l.nextFile; p.f != nil {
			p.f.Close()
		}
		l.preparing = false
	}
	if l.f == nil {
		return nil
	}
	return l.f.Close()
}
