package storage

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
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
	f, err := in.makeFile(gen)
	if err != nil {
		return err
	}
	in.use(f, gen)
	return nil
}

// use makes f, generation gen's file, the one appended to. Called with mu
// held (or before anyone else can).
func (in *intake) use(f *os.File, gen int64) {
	if in.f != nil {
		in.f.Close()
	}
	in.f, in.gen, in.size = f, gen, 0
}

// prepared is a log file made ahead of its turn.
type prepared struct {
	f   *os.File
	err error
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
		f, err := in.makeFile(gen)
		in.nextFile <- prepared{f, err}
	}()
}

// rotate moves appends to the next generation's file: the one prepared
// ahead (waiting for it if it is still being made), else a new one. Called
// with mu held.
func (in *intake) rotate() error {
	if !in.preparing {
		return in.startFile(in.gen + 1)
	}
	p := <-in.nextFile
	in.preparing = false
	if p.err != nil {
		return p.err
	}
	in.use(p.f, in.gen+1)
	return nil
}

// makeFile creates generation gen's file, ready to append to. Under
// SyncFull the folder is synced, so that the new name is durable before a
// record in it is.
func (in *intake) makeFile(gen int64) (*os.File, error) {
	f, err := os.OpenFile(in.path(gen), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("storage: intake log: %w", err)
	}
	// The file is written full of zeros first, and synced: an append then
	// overwrites blocks the file system has already allocated, so its
	// fdatasync writes the data alone. Appending past the end would
	// change the file's size, and each sync would also commit the file
	// system's journal. A zero length ends the records.
	if err := prefill(f, intakeFileMax); err != nil {
		f.Close()
		return nil, err
	}
	// Held while appended to: a delete of every capture it names leaves
	// it be (removeUnheld).
	if err := holdSegment(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("storage: intake log: %w", err)
	}
	if in.sync { // the folder is the body segments' (BodiesDir)
		if err := in.db.bodies.syncDir(); err != nil {
			f.Close()
			return nil, fmt.Errorf("storage: sync folder: %w", err)
		}
	}
	return f, nil
}

// prefill writes n zero bytes to f and syncs it.
func prefill(f *os.File, n int64) error {
	zeros := make([]byte, 1<<20)
	for off := int64(0); off < n; off += int64(len(zeros)) {
		if _, err := f.WriteAt(zeros[:min(int64(len(zeros)), n-off)], off); err != nil {
			return fmt.Errorf("storage: intake log: %w", err)
		}
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("storage: intake log: %w", err)
	}
	return nil
}

// readLog reads the records of log file gen from offset start. cut is
// where a torn or damaged frame begins (-1: the file ends cleanly).
func readLog(path string, gen, start int64) (recs []logged, cut int64, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, -1, fmt.Errorf("storage: read intake log: %w", err)
	}
	off := start
	for off < int64(len(data)) {
		if int64(len(data))-off < 8 {
			return recs, off, nil
		}
		n := int64(binary.LittleEndian.Uint32(data[off:]))
		sum := binary.LittleEndian.Uint32(data[off+4:])
		if n == 0 && sum == 0 {
			return recs, -1, nil // the zeros past the last record
		}
		if n == 0 || n > maxRecord || off+8+n > int64(len(data)) {
			return recs, off, nil
		}
		payload := data[off+8 : off+8+n]
		if crc32.Checksum(payload, castagnoli) != sum {
			return recs, off, nil
		}
		off += 8 + n
		recs = append(recs, logged{rec: payload, end: pos{gen, off}})
	}
	return recs, -1, nil
}
