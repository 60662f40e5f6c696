package agentdb

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/calltap/calltap/storage/disktest"
	"github.com/calltap/calltap/storage/intake"
)

// intakeLogSizes is the size of each intake log file of the store at path.
func intakeLogSizes(t *testing.T, path string) map[string]int64 {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(BodiesDir(path), intake.Prefix+"*.log"))
	if err != nil {
		t.Fatal(err)
	}
	sizes := map[string]int64{}
	for _, name := range names {
		fi, err := os.Stat(name)
		if err != nil {
			t.Fatal(err)
		}
		sizes[filepath.Base(name)] = fi.Size()
	}
	return sizes
}

// With 4 MiB free, less than a log file's reservation, the agent's store
// still opens: its log starts with no space reserved, takes records, and
// no partly written file is left. (On 7890542 the open failed writing the
// 8 MiB of zeros, "no space left on device", and left the part it wrote.)
func TestIntakeStartsOnANearlyFullDisk(t *testing.T) {
	ctx := context.Background()
	dir := disktest.Dir(t, 32<<20)
	disktest.Fill(t, dir, 4<<20)
	path := filepath.Join(dir, "agent.db")
	db, err := OpenAgent(ctx, path, WithIntake())
	for name, size := range intakeLogSizes(t, path) {
		if size != 0 {
			t.Errorf("%s holds %d bytes before any record: nothing may be written ahead without the room", name, size)
		}
	}
	if err != nil {
		t.Fatalf("open with 4 MiB free: %v", err)
	}
	c := testCapture(1, []byte(`{"n":1}`))
	if _, err := db.LogCaptures(ctx, []*Capture{c}, nil); err != nil {
		t.Fatalf("a record with 4 MiB free: %v", err)
	}
	// The disk full: the append is refused and taken back, in the same
	// file (not a new file per refusal); with room again, the next is
	// saved there.
	gen, size := db.intake.log.Gen(), logSize(db)
	free := disktest.Fill(t, dir, 0)
	big := []byte(fmt.Sprintf(`{"pad":"%s"}`, strings.Repeat("b", 64<<10)))
	if _, err := db.LogCaptures(ctx, []*Capture{testCapture(2, big)}, nil); err == nil || !strings.Contains(err.Error(), "no space left") {
		t.Fatalf("an append to a full disk: %v, want it refused for want of space", err)
	}
	if fi, err := os.Stat(db.intake.log.Path(gen)); err != nil || fi.Size() != size || db.intake.log.Gen() != gen {
		t.Fatalf("after the refused append: log %d of %v bytes (%v), want log %d of %d", db.intake.log.Gen(), fi.Size(), err, gen, size)
	}
	free()
	c3 := testCapture(3, big)
	if _, err := db.LogCaptures(ctx, []*Capture{c3}, nil); err != nil || db.intake.log.Gen() != gen {
		t.Fatalf("with room again: %v, in log %d (want %d)", err, db.intake.log.Gen(), gen)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = openIntakeDB(t, path)
	defer db.Close()
	for _, id := range []string{c.ID, c3.ID} {
		if _, err := db.Capture(ctx, id); err != nil {
			t.Fatalf("a record logged on the nearly full disk: %v", err)
		}
	}
	if n := countCaptures(t, db); n != 2 {
		t.Fatalf("%d captures, want the 2 saved", n)
	}
}

// When the disk has not the room for the next log's reservation, the log
// moves on to a file without one: every record is taken, and making the
// file ahead does not fill the disk. (On 7890542 the next file's 8 MiB of
// zeros filled the 6 MiB left, and the append that moved to it failed.)
func TestIntakeNextLogOnANearlyFullDisk(t *testing.T) {
	holdApplies(t)
	ctx := context.Background()
	dir := disktest.Dir(t, 48<<20)
	path := filepath.Join(dir, "agent.db")
	db := openIntakeDB(t, path)
	if false {
		t.Fatalf("the first log reserved %d bytes on an empty disk, want %d", db.intake.log.Reserved(), intake.FileMax)
	}
	free := disktest.Fill(t, dir, 6<<20)
	first := db.intake.log.Gen()
	var ids []string
	for n := 0; db.intake.log.Gen() == first || n%100 != 0; n++ {
		c := testCapture(n, []byte(fmt.Sprintf(`{"n":%d,"pad":"%s"}`, n, strings.Repeat("f", 4000))))
		if _, err := db.LogCaptures(ctx, []*Capture{c}, nil); err != nil {
			t.Fatalf("record %d (%d bytes into log %d), 6 MiB free at first: %v", n, logSize(db), db.intake.log.Gen(), err)
		}
		ids = append(ids, c.ID)
	}
	if left := disktest.Free(t, dir); left < 5<<20 {
		t.Fatalf("%d bytes free after moving to log %d with 6 MiB free: the next log took the room", left, db.intake.log.Gen())
	}
	free()
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = openIntakeDB(t, path)
	defer db.Close()
	if n := countCaptures(t, db); n != len(ids) {
		t.Fatalf("%d captures, want the %d logged", n, len(ids))
	}
}

// A log the agent no longer writes keeps its records, not the zeros
// reserved after them: it lives as long as the bodies in it, and each
// start (after a kill or an orderly stop) left 8 MiB of zeros behind, so a
// small disk filled up after a few restarts (the chaos run's 64 MiB disk,
// team seed 3001: the agent could start no more).
func TestIntakeLogGivesBackItsReserve(t *testing.T) {
	ctx := context.Background()
	for _, stop := range []string{"kill", "orderly"} {
		path := filepath.Join(t.TempDir(), "agent.db")
		db, err := OpenAgent(ctx, path, WithIntake())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.LogCaptures(ctx, []*Capture{testCapture(1, []byte(`{"kept":"in the log"}`))}, nil); err != nil {
			t.Fatal(err)
		}
		first := intake.Name(db.intake.log.Gen())
		if stop == "kill" {
			crash(t, db)
		} else if err := db.Close(); err != nil {
			t.Fatal(err)
		}
		if size := intakeLogSizes(t, path)[first]; size < intake.FileMax {
			t.Fatalf("%s: %s holds %d bytes before the restart; the test needs its reserve (%d)", stop, first, size, intake.FileMax)
		}
		db = openAgentAt(t, path)
		if size, ok := intakeLogSizes(t, path)[first]; !ok || size >= 1<<10 {
			t.Errorf("%s: after the restart %s holds %d bytes (kept: %v), want its one record's", stop, first, size, ok)
		}
		if got, err := db.Capture(ctx, testCapture(1, nil).ID); err != nil || string(got.Body) != `{"kept":"in the log"}` {
			t.Errorf("%s: the capture after the restart: %v", stop, err)
		}
	}
}

// A stop on a full disk is orderly: Close says nothing of the records the
// log could not apply, and keeps them for the next start.
func TestCloseOnAFullDiskKeepsTheLog(t *testing.T) {
	holdApplies(t)
	ctx := context.Background()
	dir := disktest.Dir(t, 48<<20)
	path := filepath.Join(dir, "agent.db")
	db := openIntakeDB(t, path)
	// Headers go into the database's rows (bodies stay in the log): the
	// apply needs pages the full disk refuses. Fewer than applyBatch, so
	// that held applies wait.
	var cs []*Capture
	for n := range applyBatch - 100 {
		c := testCapture(n, []byte(`{"n":1}`))
		c.RequestHeaders = fmt.Sprintf(`[["X-Pad",%q]]`, strings.Repeat("f", 8000))
		cs = append(cs, c)
	}
	if _, err := db.LogCaptures(ctx, cs, nil); err != nil {
		t.Fatal(err)
	}
	free := disktest.Fill(t, dir, 0)
	if err := db.Close(); err != nil {
		t.Errorf("Close on a full disk: %v, want an orderly stop", err)
	}
	if unapplied(t, path) == 0 {
		t.Fatal("the log was applied on a full disk: the test needs it not to be")
	}
	free()
	db = openIntakeDB(t, path)
	defer db.Close()
	if n := countCaptures(t, db); n != len(cs) {
		t.Fatalf("%d captures after the restart, want the %d logged", n, len(cs))
	}
}

// An apply that fails (the disk full) is tried again after a pause, with
// nothing new logged and nobody reading: once there is room, the log's
// records reach the store by themselves.
func TestIntakeApplyRetriedAfterAFullDisk(t *testing.T) {
	ctx := context.Background()
	dir := disktest.Dir(t, 48<<20)
	db := openIntakeDB(t, filepath.Join(dir, "agent.db"))
	defer db.Close()
	free := disktest.Fill(t, dir, 0)
	// Rows the full disk has no pages for; the records fit in the log's
	// reserved zeros. Fewer than applyBatch: one apply.
	var cs []*Capture
	for n := range applyBatch - 100 {
		c := testCapture(n, []byte(`{"n":1}`))
		c.RequestHeaders = fmt.Sprintf(`[["X-Pad",%q]]`, strings.Repeat("f", 8000))
		cs = append(cs, c)
	}
	if _, err := db.LogCaptures(ctx, cs, nil); err != nil {
		t.Fatal(err)
	}
	in := db.intake
	failed := func() error {
		in.applyMu.Lock()
		defer in.applyMu.Unlock()
		return in.failed
	}
	// The deadlines bound a hang (under gremlins' timeout of the package's
	// tests); each wait takes a second or so.
	for deadline := time.Now().Add(30 * time.Second); failed() == nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) || in.npending.Load() == 0 {
			t.Fatalf("the apply did not fail on a full disk (pending %d)", in.npending.Load())
		}
	}
	free()
	for deadline := time.Now().Add(20 * time.Second); in.npending.Load() != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d records still pending 20 s after the disk had room again (last error %v)", in.npending.Load(), failed())
		}
	}
}
