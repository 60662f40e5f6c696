package intake

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"os"
)

// Record is a whole frame read back from a log file.
type Record struct {
	Payload []byte
	End     int64 // the offset just past its frame
}

// Scan is what a log file holds from an offset on.
type Scan struct {
	Records []Record // its whole records, up to the damage if any
	Cut     int64    // where the damage begins; -1: the records end cleanly
	End     int64    // just past its last byte that is not zero
	Size    int64    // the file's size
	Torn    int      // records begun in the damaged bytes
	After   int      // whole records past the damage
	Skip    int64    // damaged bytes: from Cut to the first whole record after it, or to End
}

// ReadLog reads the records of the log file at path from offset start.
// The records end where the rest of the file is zeros (the space reserved
// ahead) or the file ends; a frame before that whose length or checksum
// does not hold is damage (Cut), and the rest is searched for whole
// records past it.
func ReadLog(path string, start int64) (Scan, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Scan{}, fmt.Errorf("storage: read intake log: %w", err)
	}
	s := Scan{Cut: -1, Size: int64(len(data)), End: int64(len(data))}
	for s.End > start && data[s.End-1] == 0 {
		s.End--
	}
	off := start
	for off < s.End {
		n, ok := FrameAt(data, off)
		if !ok {
			s.Cut = off
			s.Torn, s.After, s.Skip = damaged(data, off, s.End)
			break
		}
		off += 8 + n
		s.Records = append(s.Records, Record{Payload: data[off-n : off], End: off})
	}
	return s, nil
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
		if n := int64(binary.LittleEndian.Uint32(data[cut:])); n > 0 && n <= MaxRecord && cut+8+n <= int64(len(data)) {
			from = cut + 8 + n
		}
	}
	first := end
	for p := from; p < end; {
		if n, ok := FrameAt(data, p); ok {
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
		if n == 0 || n > MaxRecord {
			break
		}
		p += 8 + n
	}
	return torn, after, first - cut
}

// TrimReserve gives back the zeros reserved past the last record of a log
// no longer written (an open starts a new one): a log that holds bodies
// stays as long as their captures, and each start left 8 MiB of zeros
// behind (the chaos run's 64 MiB disk, seed 3001, filled with them after a
// few restarts, and the agent could start no more). start is where the
// log's unread records begin: whole records lie before it.
func TrimReserve(path string, s Scan, start int64) error {
	end := start
	if len(s.Records) > 0 {
		end = s.Records[len(s.Records)-1].End
	}
	if s.Size <= end {
		return nil
	}
	if err := os.Truncate(path, end); err != nil {
		return fmt.Errorf("storage: give back an intake log's reserved space: %w", err)
	}
	return nil
}

// CutTorn cuts the torn last record of the log at path (s.Cut, no whole
// record past it in this log or a newer one), and says so.
func CutTorn(path string, s Scan) error {
	if err := os.Truncate(path, s.Cut); err != nil {
		return fmt.Errorf("storage: cut the intake log's torn record: %w", err)
	}
	slog.Warn("storage: cut a torn record off the intake log: a crash left it half written, and no record follows it, so none of what was cut had been acknowledged",
		"file", path, "offset", s.Cut, "bytes", s.End-s.Cut, "records", s.Torn, "acknowledged", 0, "size_before", s.Size)
	return nil
}

// CheckDamage returns a *DamageError if a log of gens (oldest first, each
// read from the offset start gives) is damaged with a whole record past
// the damage, in it or in a newer log. It changes nothing.
func (l *Log) CheckDamage(gens []int64, start func(gen int64) int64) error {
	var (
		bad    *Scan // the first damage found
		badGen int64
		newer  int // whole records in the logs after badGen's
	)
	for _, g := range gens {
		s, err := ReadLog(l.Path(g), start(g))
		if err != nil {
			return err
		}
		switch {
		case bad != nil:
			newer += len(s.Records) + s.After
		case s.Cut >= 0:
			bad, badGen = &s, g
			bad.Records = nil // not kept: only counted
		}
	}
	if bad == nil || bad.After+newer == 0 {
		return nil
	}
	return &DamageError{Path: l.Path(badGen), Scan: *bad, Newer: newer}
}

// DamageError is a log damaged before records that were synced.
type DamageError struct {
	Path  string
	Scan  Scan
	Newer int // whole records in newer logs
}

func (e *DamageError) Error() string {
	s := e.Scan
	return fmt.Sprintf("storage: intake log %s is damaged at offset %d: its %d bytes from there hold no whole record "+
		"(%d record(s) lost), and %d whole record(s) follow them (%d in this log, %d in newer logs), so the lost record(s) "+
		"had been synced, and their senders may have been told they were saved. Nothing was changed. To go on without them, cut the log "+
		"at the damage and start again: truncate -s %d %s. That also drops the %d record(s) after the damage in this "+
		"log; the records before offset %d and the %d in newer logs are kept",
		e.Path, s.Cut, s.Skip, s.Torn, s.After+e.Newer, s.After, e.Newer, s.Cut, e.Path, s.After, s.Cut, e.Newer)
}
