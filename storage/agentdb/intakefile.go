package agentdb

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// The intake log's files (intake.go): naming, making one ready to append
// to ahead of its turn, reading one back.

// files lists the generations of the log files in the folder, oldest first.
func (in *intake) files() ([]int64, error) {
	entries, err := os.ReadDir(in.dir)
	if err != nil {
		return nil, fmt.Errorf("storage: intake folder: %w", err)
	}
	var gens []int64
	for _, e := range entries {
		name, isLog := strings.CutSuffix(e.Name(), ".log")
		num, isIntake := strings.CutPrefix(name, intakePrefix)
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

func (in *intake) path(gen int64) string {
	return filepath.Join(in.dir, logName(gen))
}

// logName is the file name of generation gen's log.
func logName(gen int64) string { return fmt.Sprintf("%s%016d.log", intakePrefix, gen) }

// startFile makes generation gen's file the one appended to.
func (in *intake) startFile(gen int64) error {
	f, reserved, err := in.makeFile(gen)
	if err != nil {
		return err
	}
	in.use(f, gen, reserved)
	return nil
}

// use makes f, generation gen's file with reserved bytes of zeros made
// ahead, the one appended to. Called with mu held (or before anyone else
// can).
func (in *intake) use(f *os.File, gen, reserved int64) {
	if in.f != nil {
		in.f.Close()
	}
	in.f, in.gen, in.size, in.reserved, in.unsynced = f, gen, 0, reserved, false
}

// prepared is a log file made ahead of its turn.
type prepared struct {
	f        *os.File
	reserved int64
	err      error
}

// prepareNext starts making the next generation's file while the current
// one still has room, so that the append that fills it does not wait for
// 8 MiB of zeros and their sync. Called with mu held.
func (in *intake) prepareNext() {
	if in.preparing {
		return
	}
	in.preparing = true
	gen := in.gen + 1
	go func() {
		f, reserved, err := in.makeFile(gen)
		in.nextFile <- prepared{f, reserved, err}
	}()
}

// rotate moves appends to the next generation's file: the one prepared
// ahead (waiting for it if it is still being made), else a new one. Called
// with mu held.
//
// The file left is synced first (under SyncFull): a batch of updates
// alone is not synced when it is appended, and a record in a newer file
// must never be on disk while one before it, in an older file, is not.
// The start relies on that: damage with a whole record after it, in any
// file, is damage to a record that was synced (recover).
func (in *intake) rotate() error {
	if in.sync && in.unsynced {
		// Not tried again if it fails: after a failed sync the pages'
		// state is past knowing (LogCaptures), and a log that could
		// never move on would refuse every request.
		in.unsynced = false
		if err := syscall.Fdatasync(int(in.f.Fd())); err != nil {
			return fmt.Errorf("storage: sync the intake log: %w", err)
		}
	}
	if !in.preparing {
		return in.startFile(in.gen + 1)
	}
	p := <-in.nextFile
	in.preparing = false
	if p.err != nil {
		return p.err
	}
	in.use(p.f, in.gen+1, p.reserved)
	return nil
}

// makeFile creates generation gen's file, ready to append to, and returns
// how many bytes of zeros it holds ahead of the appends (reserve). Under
// SyncFull the folder is synced, so that the new name is durable before a
// record in it is. A file it fails to make ready is removed.
func (in *intake) makeFile(gen int64) (*os.File, int64, error) {
	path := in.path(gen)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, 0, fmt.Errorf("storage: intake log: %w", err)
	}
	reserved := reserve(f, intakeFileMax)
	// Held while appended to: a delete of every capture it names leaves
	// it be (removeUnheld).
	err = holdSegment(f)
	if err == nil && in.sync { // the folder is the body segments' (BodiesDir)
		err = in.db.bodies.syncDir()
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
// the records (readLog).
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

// logScan is what a log file holds from an offset on.
type logScan struct {
	recs  []logged // its whole records, up to the damage if any
	cut   int64    // where the damage begins; -1: the records end cleanly
	end   int64    // just past its last byte that is not zero
	size  int64    // the file's size
	torn  int      // records begun in the damaged bytes
	after int      // whole records past the damage
	skip  int64    // damaged bytes: from cut to the first whole record after it, or to end
}

// readLog reads the records of log file gen from offset start. The
// records end where the rest of the file is zeros (the space reserved
// ahead) or the file ends; a frame before that whose length or checksum
// does not hold is damage (cut), and the rest is searched for whole
// records past it.
func readLog(path string, gen, start int64) (logScan, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return logScan{}, fmt.Errorf("storage: read intake log: %w", err)
	}
	s := logScan{cut: -1, size: int64(len(data)), end: int64(len(data))}
	for s.end > start && data[s.end-1] == 0 {
		s.end--
	}
	off := start
	for off < s.end {
		n, ok := frameAt(data, off)
		if !ok {
			s.cut = off
			s.torn, s.after, s.skip = damaged(data, off, s.end)
			break
		}
		off += 8 + n
		s.recs = append(s.recs, logged{rec: data[off-n : off], end: pos{gen, off}})
	}
	return s, nil
}

// frameAt reports whether a whole frame, its checksum holding, starts at
// off in data, and the length of its payload.
func frameAt(data []byte, off int64) (int64, bool) {
	if int64(len(data))-off < 8 {
		return 0, false
	}
	n := int64(binary.LittleEndian.Uint32(data[off:]))
	if n == 0 || n > maxRecord || off+8+n > int64(len(data)) {
		return 0, false
	}
	sum := binary.LittleEndian.Uint32(data[off+4:])
	return n, crc32.Checksum(data[off+8:off+8+n], castagnoli) == sum
}

// damaged looks at the bytes of data from cut, where a frame does not
// hold, to end: how many records were begun in them before the first
// whole one (torn: at least the one at cut), how many whole records follow
// (after), and the bytes from cut to the first of those (skip). The search
// for them goes byte by byte, but starts past the payload the frame at cut
// claims, when its length is plausible: a body may hold bytes that look
// like a frame.
func damaged(data []byte, cut, end int64) (torn, after int, skip int64) {
	from := cut + 1
	if int64(len(data))-cut >= 8 {
		if n := int64(binary.LittleEndian.Uint32(data[cut:])); n > 0 && n <= maxRecord && cut+8+n <= int64(len(data)) {
			from = cut + 8 + n
		}
	}
	first := end
	for p := from; p < end; {
		if n, ok := frameAt(data, p); ok {
			first = min(first, p)
			after++
			p += 8 + n
			continue
		}
		p++
	}
	for p := cut; p < first; {
		torn++
		if first-p < 8 {
			break
		}
		n := int64(binary.LittleEndian.Uint32(data[p:]))
		if n == 0 || n > maxRecord {
			break
		}
		p += 8 + n
	}
	return torn, after, first - cut
}
