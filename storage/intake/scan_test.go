package intake

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeLog writes data, then zeros to size, as log gen of dir.
func writeLog(t *testing.T, dir string, gen int64, data []byte, size int) string {
	t.Helper()
	path := filepath.Join(dir, Name(gen))
	if err := os.WriteFile(path, append(data, make([]byte, max(0, size-len(data)))...), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// A last record torn by a crash is damage with nothing whole after it:
// CutTorn cuts the file there, and the records before it stay.
func TestTornRecordCut(t *testing.T) {
	dir := t.TempDir()
	whole := frames("one", "two")
	torn := frames("three is long")[:12]
	path := writeLog(t, dir, 1, append(append([]byte(nil), whole...), torn...), 4096)
	s, err := ReadLog(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Records) != 2 || s.Cut != int64(len(whole)) || s.Torn != 1 || s.After != 0 || s.Size != 4096 {
		t.Fatalf("scan %+v", s)
	}
	if s.End != int64(len(whole)+len(torn)) || s.Skip != s.End-s.Cut {
		t.Errorf("end %d, skip %d", s.End, s.Skip)
	}
	l := NewLog(dir, false, nil)
	if err := l.CheckDamage([]int64{1}, func(int64) int64 { return 0 }); err != nil {
		t.Fatalf("a torn tail is not damage to report: %v", err)
	}
	if err := CutTorn(path, s); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(path); fi.Size() != int64(len(whole)) {
		t.Errorf("cut to %d bytes, want %d", fi.Size(), len(whole))
	}
	if s, _ := ReadLog(path, 0); s.Cut != -1 || len(s.Records) != 2 {
		t.Errorf("after the cut: %+v", s)
	}
	if err := CutTorn(filepath.Join(dir, "missing", "x"), s); err == nil {
		t.Error("cut a file that does not exist")
	}
}

// Damage with whole records after it, in the file or a newer one, is
// reported, with what is lost and how to go on, and nothing is changed.
func TestDamageBeforeWholeRecords(t *testing.T) {
	dir := t.TempDir()
	good := frames("one")
	bad := frames("two")
	bad[len(bad)-1] ^= 0xff // its checksum fails
	after := frames("three", "four")
	path := writeLog(t, dir, 1, append(append(append([]byte(nil), good...), bad...), after...), 0)
	writeLog(t, dir, 2, frames("five"), 64)
	s, err := ReadLog(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Records) != 1 || s.Cut != int64(len(good)) || s.Torn != 1 || s.After != 2 || s.Skip != int64(len(bad)) {
		t.Fatalf("scan %+v", s)
	}
	l := NewLog(dir, false, nil)
	err = l.CheckDamage([]int64{1, 2}, func(int64) int64 { return 0 })
	var de *DamageError
	if !errors.As(err, &de) || de.Path != path || de.Newer != 1 {
		t.Fatalf("CheckDamage: %v", err)
	}
	for _, want := range []string{path, "offset 11", "1 record(s) lost", "3 whole record(s) follow them (2 in this log, 1 in newer logs)", "truncate -s 11 " + path} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
	// Read from past the damage, it is not seen.
	if err := l.CheckDamage([]int64{1}, func(int64) int64 { return int64(len(good) + len(bad)) }); err != nil {
		t.Errorf("from past the damage: %v", err)
	}
	// Damage in the newest log alone, with a whole record in it after.
	if err := l.CheckDamage([]int64{2, 1}, func(int64) int64 { return 0 }); err == nil {
		t.Error("damage with a whole record after it, in its own log, was not reported")
	}
	if err := l.CheckDamage([]int64{3}, func(int64) int64 { return 0 }); err == nil {
		t.Error("a missing log was read")
	}
}

// The search for whole records past damage starts past the payload the
// damaged frame claims, when that is plausible: a body that holds bytes
// that look like a frame is not taken for records.
func TestDamageSearchSkipsClaimedPayload(t *testing.T) {
	inner := frames("looks like a frame")
	bad := frames(string(inner))
	bad[5] ^= 0xff // the outer frame's checksum fails
	data := append(append([]byte(nil), bad...), 0, 0)
	torn, after, skip := damaged(data, 0, int64(len(bad)))
	if after != 0 || torn != 1 || skip != int64(len(bad)) {
		t.Errorf("torn %d, after %d, skip %d: want 1, 0, %d", torn, after, skip, len(bad))
	}
	// A length past the data: the search starts at the next byte, and
	// finds the frame inside.
	data = append([]byte{0xff, 0xff, 0xff, 0x0f, 0, 0, 0, 0}, inner...)
	torn, after, skip = damaged(data, 0, int64(len(data)))
	if after != 1 || torn != 1 || skip != 8 {
		t.Errorf("torn %d, after %d, skip %d: want 1, 1, 8", torn, after, skip)
	}
	// Two torn records before a whole one.
	two := append(append(frames("aaaa"), frames("bbbb")...), frames("c")...)
	two[5] ^= 0xff
	two[12+5] ^= 0xff
	torn, after, skip = damaged(two, 0, int64(len(two)))
	if torn != 2 || after != 1 || skip != 24 {
		t.Errorf("torn %d, after %d, skip %d: want 2, 1, 24", torn, after, skip)
	}
	// A short tail: one torn record.
	torn, after, skip = damaged([]byte{1, 2, 3}, 0, 3)
	if torn != 1 || after != 0 || skip != 3 {
		t.Errorf("short tail: torn %d, after %d, skip %d", torn, after, skip)
	}
}

// TrimReserve gives back the zeros past the last record, and leaves a
// file with none alone.
func TestTrimReserve(t *testing.T) {
	dir := t.TempDir()
	recs := frames("a", "b")
	path := writeLog(t, dir, 1, recs, 1<<16)
	s, _ := ReadLog(path, 0)
	if err := TrimReserve(path, s, 0); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(path); fi.Size() != int64(len(recs)) {
		t.Errorf("trimmed to %d, want %d", fi.Size(), len(recs))
	}
	// Every record applied already (start at the end): trimmed to start.
	path = writeLog(t, dir, 2, recs, 1<<16)
	s, _ = ReadLog(path, int64(len(recs)))
	if err := TrimReserve(path, s, int64(len(recs))); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(path); fi.Size() != int64(len(recs)) {
		t.Errorf("trimmed from its end to %d, want %d", fi.Size(), len(recs))
	}
	s.Size = 1 << 16
	if err := TrimReserve(filepath.Join(dir, "missing", "x"), s, 0); err == nil {
		t.Error("trimmed a file that does not exist")
	}
	if err := TrimReserve(filepath.Join(dir, "missing", "x"), Scan{Size: 4}, 4); err != nil {
		t.Errorf("a file with nothing to trim: %v", err)
	}
}

// The zeros at the end are found down to the start offset, no further: a
// payload may end in a zero byte.
func TestReadLogEndStopsAtStart(t *testing.T) {
	dir := t.TempDir()
	rec := frames("a\x00")
	path := writeLog(t, dir, 1, rec, 64)
	s, err := ReadLog(path, int64(len(rec)))
	if err != nil || s.End != int64(len(rec)) || len(s.Records) != 0 || s.Cut != -1 {
		t.Fatalf("from the end of the records: %+v, %v", s, err)
	}
	s, _ = ReadLog(path, 0)
	if len(s.Records) != 1 || string(s.Records[0].Payload) != "a\x00" || s.End != int64(len(rec))-1 { // End: past the last byte not zero
		t.Errorf("from 0: %+v", s)
	}
}

// A damaged last frame whose claimed payload fits exactly is skipped
// whole: a frame inside its payload is not a record after the damage.
func TestDamagedLastFrameSkippedWhole(t *testing.T) {
	bad := frames(string(frames("inner")))
	bad[5] ^= 0xff
	torn, after, skip := damaged(bad, 0, int64(len(bad)))
	if torn != 1 || after != 0 || skip != int64(len(bad)) {
		t.Errorf("torn %d, after %d, skip %d", torn, after, skip)
	}
}

// The records after the damage are counted in every newer log, whole or
// past damage of its own; one record after the damage and one in a newer
// log are two.
func TestDamageCountsNewerLogs(t *testing.T) {
	dir := t.TempDir()
	bad := frames("two")
	bad[len(bad)-1] ^= 0xff
	writeLog(t, dir, 1, append(append(frames("one"), bad...), frames("three")...), 0)
	writeLog(t, dir, 2, frames("four"), 0)
	writeLog(t, dir, 3, append(append(frames("five"), bad...), frames("six")...), 0)
	l := NewLog(dir, false, nil)
	var de *DamageError
	if err := l.CheckDamage([]int64{1, 2, 3}, func(int64) int64 { return 0 }); !errors.As(err, &de) || de.Newer != 3 || de.Scan.After != 1 {
		t.Fatalf("CheckDamage: %v", err)
	}
	if err := l.CheckDamage([]int64{1, 2}, func(int64) int64 { return 0 }); !errors.As(err, &de) || de.Newer != 1 {
		t.Fatalf("one after, one newer: %v", err)
	}
}

// A damaged tail shorter than a frame's header, after whole records, is
// one torn record; a zero length at the damage does not hide a whole
// record that starts right after it.
func TestDamageShortAndZeroHeaders(t *testing.T) {
	data := append(frames("a"), 1, 2, 3)
	cut := int64(len(data) - 3)
	if torn, after, skip := damaged(data, cut, int64(len(data))); torn != 1 || after != 0 || skip != 3 {
		t.Errorf("a 3-byte tail: torn %d, after %d, skip %d", torn, after, skip)
	}
	data = append([]byte{0, 0, 0, 0}, frames("x")...)
	if torn, after, skip := damaged(data, 0, int64(len(data))); torn != 1 || after != 1 || skip != 4 {
		t.Errorf("a zero length before a whole record: torn %d, after %d, skip %d", torn, after, skip)
	}
}

// CutTorn says what it cut: where, how many bytes, how many records.
func TestCutTornLogs(t *testing.T) {
	var out bytes.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&out, nil)))
	defer slog.SetDefault(old)
	dir := t.TempDir()
	whole := frames("one")
	path := writeLog(t, dir, 1, append(append([]byte(nil), whole...), frames("torn one")[:10]...), 100)
	s, _ := ReadLog(path, 0)
	if err := CutTorn(path, s); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"offset=11", "bytes=10", "records=1", "size_before=100"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("log %q does not say %s", out.String(), want)
		}
	}
}
