package agentdb

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/calltap/calltap/storage/intake"
)

// captureLog sends slog's default logger to a buffer for the test.
func captureLog(t *testing.T) *syncLog {
	t.Helper()
	old := slog.Default()
	l := &syncLog{}
	slog.SetDefault(slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelWarn})))
	t.Cleanup(func() { slog.SetDefault(old) })
	return l
}

// syncLog is a buffer slog writes to from any goroutine.
type syncLog struct {
	mu  sync.Mutex
	buf bytes.Buffer // guarded by mu
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// lines returns the lines logged that contain s.
func (l *syncLog) lines(s string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range strings.Split(l.buf.String(), "\n") {
		if strings.Contains(line, s) {
			out = append(out, line)
		}
	}
	return out
}

// logThree logs three captures, one call each, and returns their ids, the
// log file and the offsets where each record starts and the last ends.
func logThree(t *testing.T, db *AgentStore) (ids []string, file string, starts []int64, end int64) {
	t.Helper()
	for i := range 3 {
		c := testCapture(i+1, []byte(fmt.Sprintf(`{"n":%d,"pad":"%s"}`, i, strings.Repeat("p", 300))))
		starts = append(starts, logSize(db))
		if _, err := db.LogCaptures(context.Background(), []*Capture{c}, nil); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, c.ID)
	}
	return ids, db.intake.log.Path(db.intake.log.Gen()), starts, logSize(db)
}

// zero writes n zero bytes at off in the file at path.
func zero(t *testing.T, path string, off, n int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(make([]byte, n), off); err != nil {
		t.Fatal(err)
	}
}

// countCaptures is how many captures the store lists.
func countCaptures(t *testing.T, db *AgentStore) int {
	t.Helper()
	_, n, err := db.Captures(context.Background(), CaptureFilter{Page: Page{Limit: 10}})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// A power cut tears the last record of a log (its second half never
// reached the disk), whatever newer log was made ahead of it: empty,
// all zeros, or none. Nothing past the tear was acknowledged, so the store
// opens, cuts it, and says so in one WARN line with the numbers; the
// records before it are all there. (On 7890542 the store refused to open
// when a newer log followed, and cut silently when none did.)
func TestIntakeTornTailIsCutWhateverFollows(t *testing.T) {
	for _, newer := range []string{"none", "empty", "zeros"} {
		t.Run(newer, func(t *testing.T) {
			holdApplies(t)
			logs := captureLog(t)
			path := filepath.Join(t.TempDir(), "agent.db")
			db := openIntakeDB(t, path)
			ids, file, starts, end := logThree(t, db)
			next := db.intake.log.Path(db.intake.log.Gen() + 1)
			crash(t, db)
			switch newer {
			case "empty":
				if err := os.WriteFile(next, nil, 0o600); err != nil {
					t.Fatal(err)
				}
			case "zeros":
				if err := os.WriteFile(next, make([]byte, intake.FileMax), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			last := starts[2]
			half := last + (end-last)/2
			zero(t, file, half, end-half)
			fi, err := os.Stat(file)
			if err != nil {
				t.Fatal(err)
			}

			db, err = OpenAgent(context.Background(), path, append(held(), WithIntake())...)
			if err != nil {
				t.Fatalf("open after a torn last record (newer log: %s): %v", newer, err)
			}
			if n := countCaptures(t, db); n != 2 {
				t.Fatalf("%d captures after the cut, want the 2 before it", n)
			}
			for _, id := range ids[:2] {
				if _, err := db.Capture(context.Background(), id); err != nil {
					t.Fatalf("%s: %v", id, err)
				}
			}
			warns := logs.lines("cut a torn record")
			if len(warns) != 1 {
				t.Fatalf("WARN lines for the cut: %q, want 1", warns)
			}
			w := warns[0]
			for _, want := range []string{"level=WARN", "file=" + file, fmt.Sprintf("offset=%d", last),
				"records=1", "acknowledged=0", fmt.Sprintf("size_before=%d", fi.Size())} {
				if !strings.Contains(w, want) {
					t.Errorf("the WARN line %q does not say %q", w, want)
				}
			}
			var cut int64
			if _, err := fmt.Sscanf(w[strings.Index(w, " bytes=")+1:], "bytes=%d", &cut); err != nil || cut <= 0 || cut > half-last {
				t.Errorf("the WARN line %q: bytes=%d (%v), want the torn record's written bytes, 1..%d", w, cut, err, half-last)
			}
			if err := db.Close(); err != nil {
				t.Fatal(err)
			}
			// Once cut, nothing more to cut or say.
			db = openIntakeDB(t, path)
			defer db.Close()
			if n := countCaptures(t, db); n != 2 {
				t.Fatalf("reopened: %d captures, want 2", n)
			}
			if warns := logs.lines("cut a torn record"); len(warns) != 1 {
				t.Fatalf("after the reopen, WARN lines for cuts: %q, want the first one only", warns)
			}
		})
	}
}

// Damage with whole records after it is damage to records that were
// synced (acknowledged): the store refuses to open, changes nothing, and
// says which file, where, what is lost and the command that goes on. Run
// as said, the store opens with every record before the damage. (On
// 7890542 the store cut the log at the damage, in silence, and lost the
// two acknowledged records after it.)
func TestIntakeDamageBeforeSyncedRecordsIsReported(t *testing.T) {
	holdApplies(t)
	path := filepath.Join(t.TempDir(), "agent.db")
	db := openIntakeDB(t, path)
	ids, file, starts, _ := logThree(t, db)
	crash(t, db)
	zero(t, file, starts[1]+20, 10) // inside the second record's payload
	before, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}

	_, err = OpenAgent(context.Background(), path, append(held(), WithIntake())...)
	if err == nil {
		t.Fatal("the store opened past damage that whole records follow")
	}
	msg := err.Error()
	for _, want := range []string{file, fmt.Sprintf("damaged at offset %d", starts[1]), "(1 record(s) lost)",
		"1 whole record(s) follow them (1 in this log, 0 in newer logs)", "Nothing was changed",
		fmt.Sprintf("truncate -s %d %s", starts[1], file)} {
		if !strings.Contains(msg, want) {
			t.Errorf("the error %q does not say %q", msg, want)
		}
	}
	if after, err := os.ReadFile(file); err != nil || !bytes.Equal(after, before) {
		t.Fatalf("the refused open changed the damaged log (%v)", err)
	}

	// The way on, as the message says.
	if err := os.Truncate(file, starts[1]); err != nil {
		t.Fatal(err)
	}
	db = openIntakeDB(t, path)
	defer db.Close()
	if n := countCaptures(t, db); n != 1 {
		t.Fatalf("%d captures after the cut, want the 1 before the damage", n)
	}
	if _, err := db.Capture(context.Background(), ids[0]); err != nil {
		t.Fatal(err)
	}
}

// A store opened without the intake log (calltap's other commands) after
// the agent was killed applies what the log holds, records the next
// generation and deletes the log files no capture names; with nothing
// logged since, a second such open writes nothing.
func TestOpenWithoutTheLogRecoversIt(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agent.db")
	db := openIntakeDB(t, path)
	c := testCapture(1, nil) // no body: no capture names the log
	if _, err := db.LogCaptures(ctx, []*Capture{c}, nil); err != nil {
		t.Fatal(err)
	}
	gen := db.intake.log.Gen()
	crash(t, db)
	for i := range 2 {
		db, err := OpenAgent(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.Capture(ctx, c.ID); err != nil {
			t.Fatalf("open %d: the logged capture: %v", i, err)
		}
		db.Close()
		if gens, err := intake.Files(BodiesDir(path)); err != nil || len(gens) != 0 {
			t.Errorf("open %d: logs %v (%v) left, want the applied one deleted", i, gens, err)
		}
		ro, err := sql.Open("sqlite3", "file:"+path+"?mode=ro")
		if err != nil {
			t.Fatal(err)
		}
		var applied int64
		if err := ro.QueryRow(`SELECT applied_gen FROM intake_state`).Scan(&applied); err != nil || applied != gen+1 {
			t.Errorf("open %d: the recorded generation %d (%v), want %d", i, applied, err, gen+1)
		}
		ro.Close()
	}
}

// A killed agent's log of more records than one apply takes is applied
// whole at the next open, a batch at a time.
func TestRecoverAppliesEveryBatch(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agent.db")
	db := openIntakeDB(t, path)
	// No apply from here: applyLoop stops (crash, below, as for a kill).
	in := db.intake
	close(in.stop)
	<-in.done
	var cs []*Capture
	for i := range 2*applyBatch + 1 {
		cs = append(cs, testCapture(i, []byte(`{"n":1}`)))
	}
	if _, err := db.LogCaptures(ctx, cs, nil); err != nil {
		t.Fatal(err)
	}
	in.stop, in.done = make(chan struct{}), make(chan struct{})
	close(in.done)
	crash(t, db)
	db = openIntakeDB(t, path)
	defer db.Close()
	if n := countCaptures(t, db); n != len(cs) {
		t.Fatalf("%d captures after the restart, want the %d logged", n, len(cs))
	}
}

// A log whose only record is torn (a power cut during the first append)
// is cut to nothing, and the start says so as for any torn record.
func TestIntakeTornFirstRecordIsCut(t *testing.T) {
	holdApplies(t)
	logs := captureLog(t)
	path := filepath.Join(t.TempDir(), "agent.db")
	db := openIntakeDB(t, path)
	if start := logSize(db); start != 0 {
		t.Fatalf("the first record at %d, want 0", start)
	}
	if _, err := db.LogCaptures(context.Background(), []*Capture{testCapture(1, []byte(`{"n":1}`))}, nil); err != nil {
		t.Fatal(err)
	}
	file, end := db.intake.log.Path(db.intake.log.Gen()), logSize(db)
	crash(t, db)
	zero(t, file, end/2, end-end/2)
	db = openIntakeDB(t, path)
	defer db.Close()
	if n := countCaptures(t, db); n != 0 {
		t.Fatalf("%d captures from a torn record", n)
	}
	if fi, err := os.Stat(file); err == nil && fi.Size() != 0 {
		t.Errorf("the torn log holds %d bytes, want it cut to 0", fi.Size())
	}
	if got := logs.lines("cut a torn record"); len(got) != 1 || !strings.Contains(got[0], "offset=0") {
		t.Errorf("the start logged %q, want one line of the cut at offset 0", got)
	}
}
