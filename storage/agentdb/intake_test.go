package agentdb

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/calltap/calltap/storage/agentdb/searchindex"
	"github.com/calltap/calltap/storage/intake"
)

func openIntakeDB(t testing.TB, path string, opts ...Option) *AgentStore {
	t.Helper()
	db, err := OpenAgent(context.Background(), path, append(append(opts, held()...), WithIntake())...)
	if err != nil {
		t.Fatal(err)
	}
	if db.intake == nil {
		t.Fatal("the store has no intake log")
	}
	return db
}

// crash leaves db as a kill would: nothing pending is applied, the log's
// lock is let go (the kernel does that for a killed process).
func crash(t testing.TB, db *AgentStore) {
	t.Helper()
	in := db.intake
	in.mu.Lock()
	in.closed = true
	in.mu.Unlock()
	close(in.stop)
	<-in.done
	in.log.Close()
	in.lock.Close()
	db.intake = nil
	if err := db.closeStore(); err != nil {
		t.Fatal(err)
	}
}

// holdApplies keeps applyLoop from applying anything for the test.
func holdApplies(t *testing.T) {
	heldApplies = true
	t.Cleanup(func() { heldApplies = false })
}

// heldApplies is set by holdApplies for the test that calls it: the stores
// it opens apply their intake log only when told (or at close).
var heldApplies bool

// held is withApplyDelay(time.Hour) while heldApplies.
func held() []Option {
	if heldApplies {
		return []Option{withApplyDelay(time.Hour)}
	}
	return nil
}

// What LogCaptures saved reads back as WriteCaptures would have saved it:
// small, binary and large bodies byte-exact, responses and attempts,
// duplicates and redeliveries, before and after it is applied.
func TestIntakeRoundTrip(t *testing.T) {
	holdApplies(t)
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agent.db")
	db := openIntakeDB(t, path)
	large := bytes.Repeat([]byte("0123456789abcdef"), (intake.BodyMin+4096)/16)
	a := testCapture(1, []byte(`{"city":"Denver"}`))
	b := testCapture(2, binaryBody)
	c := testCapture(3, large)
	d := testCapture(4, []byte(`{"again":true}`))
	d.DeliveryID = a.DeliveryID
	q := testCapture(5, []byte(`{"queued":true}`))
	q.Queued, q.RelayID, q.ArrivedAt = true, "relay-5", capT0
	written, err := db.LogCaptures(ctx, []*Capture{a, b, c, d, q}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if written[3].DuplicateOf != a.ID || written[0].DuplicateOf != "" {
		t.Fatalf("duplicates: %+v", written)
	}
	// The relay sends the queued one again while it is pending.
	q2 := testCapture(6, []byte(`{"queued":true}`))
	q2.Queued, q2.RelayID = true, "relay-5"
	w2, err := db.LogCaptures(ctx, []*Capture{q2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !w2[0].Redelivered || w2[0].ID != q.ID {
		t.Fatalf("a redelivery while pending: %+v", w2[0])
	}
	if _, err := db.LogCaptures(ctx, nil, []*Capture{answeredCapture(a), answeredCapture(c)}); err != nil {
		t.Fatal(err)
	}
	if n := db.intake.npending.Load(); n != 7 {
		t.Fatalf("%d records pending, want 7 (applies held)", n)
	}
	check := func(when string) {
		t.Helper()
		for _, want := range []*Capture{a, b, c, d, q} {
			got, err := db.Capture(ctx, want.ID)
			if err != nil {
				t.Fatalf("%s: %s: %v", when, want.ID, err)
			}
			if !bytes.Equal(got.Body, want.Body) {
				t.Fatalf("%s: %s: body of %d bytes, want %d", when, want.ID, len(got.Body), len(want.Body))
			}
			if got.Path != want.Path || got.RequestHeaders != want.RequestHeaders || got.DeliveryID != want.DeliveryID || got.Queued != want.Queued {
				t.Fatalf("%s: %s: %+v", when, want.ID, got)
			}
		}
		got, _ := db.Capture(ctx, a.ID)
		ans := answeredCapture(a)
		if got.Status != StatusDelivered || got.ResponseStatus != 201 || !bytes.Equal(got.ResponseBody, ans.ResponseBody) ||
			got.Duration != ans.Duration || got.Attempts != 1 || !got.DeliveredAt.Equal(ans.DeliveredAt) {
			t.Fatalf("%s: the response: %+v", when, got)
		}
		if atts, err := db.Attempts(ctx, a.ID); err != nil || len(atts) != 1 || atts[0].ResponseStatus != 201 {
			t.Fatalf("%s: attempts %+v %v", when, atts, err)
		}
		if got, _ := db.Capture(ctx, d.ID); got.DuplicateOf != a.ID {
			t.Fatalf("%s: duplicate_of %q", when, got.DuplicateOf)
		}
		_, n, err := db.Captures(ctx, CaptureFilter{Page: Page{Limit: 100}})
		if err != nil || n != 5 {
			t.Fatalf("%s: %d captures (%v), want 5", when, n, err)
		}
	}
	// A read applies what is pending first.
	check("read while pending")
	if n := db.intake.npending.Load(); n != 0 {
		t.Fatalf("%d records still pending after a read", n)
	}
	// Redelivered once applied too.
	if w, err := db.LogCaptures(ctx, []*Capture{q2}, nil); err != nil || !w[0].Redelivered {
		t.Fatalf("a redelivery once applied: %+v %v", w, err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = openIntakeDB(t, path)
	defer db.Close()
	check("reopened")
}

// A record torn by a crash is cut; the records before it are applied once,
// and a reopen applies nothing again.
func TestIntakeTornRecordIsCut(t *testing.T) {
	holdApplies(t)
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agent.db")
	db := openIntakeDB(t, path)
	var ids []string
	for i := range 3 {
		c := testCapture(i+1, []byte(fmt.Sprintf(`{"n":%d}`, i)))
		if _, err := db.LogCaptures(ctx, []*Capture{c}, nil); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, c.ID)
	}
	logFile := db.intake.log.Path(db.intake.log.Gen())
	_, end := db.intake.log.End()
	crash(t, db)
	// The next frame, torn: its header says 400 bytes, 10 made it.
	f, err := os.OpenFile(logFile, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	torn := binary.LittleEndian.AppendUint32(nil, 400)
	torn = binary.LittleEndian.AppendUint32(torn, 0xdeadbeef)
	torn = append(torn, "0123456789"...)
	if _, err := f.WriteAt(torn, end); err != nil {
		t.Fatal(err)
	}
	f.Close()

	for round := range 2 {
		db := openIntakeDB(t, path)
		_, n, err := db.Captures(ctx, CaptureFilter{Page: Page{Limit: 10}})
		if err != nil || n != 3 {
			t.Fatalf("round %d: %d captures (%v), want 3", round, n, err)
		}
		for _, id := range ids {
			if _, err := db.Capture(ctx, id); err != nil {
				t.Fatalf("round %d: %s: %v", round, id, err)
			}
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
	}
	// The log holds the three bodies the store names: it stays, until
	// no capture names it.
	db = openIntakeDB(t, path)
	defer db.Close()
	if _, err := os.Stat(logFile); err != nil {
		t.Fatalf("the applied log that holds bodies: %v", err)
	}
	if _, err := db.DeleteCaptures(ctx, ids...); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(logFile); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the applied log %s is still there once no capture names it (%v)", logFile, err)
	}
	// The one appended to now is held, whatever is deleted.
	c := testCapture(9, []byte(`{"n":9}`))
	if _, err := db.LogCaptures(ctx, []*Capture{c}, nil); err != nil {
		t.Fatal(err)
	}
	current := db.intake.log.Path(db.intake.log.Gen())
	if _, err := db.DeleteCaptures(ctx, c.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(current); err != nil {
		t.Fatalf("the log appended to was removed: %v", err)
	}
}

// Damage in a log that newer logs follow is not a torn tail: the store
// says so rather than drop the records after it.
func TestIntakeDamageBeforeNewerLogIsReported(t *testing.T) {
	holdApplies(t)
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agent.db")
	db := openIntakeDB(t, path)
	if _, err := db.LogCaptures(ctx, []*Capture{testCapture(1, []byte(`{}`))}, nil); err != nil {
		t.Fatal(err)
	}
	first := db.intake.log.Path(db.intake.log.Gen())
	db.intake.mu.Lock()
	err := db.intake.log.Start(db.intake.log.Gen() + 1)
	db.intake.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.LogCaptures(ctx, []*Capture{testCapture(2, []byte(`{}`))}, nil); err != nil {
		t.Fatal(err)
	}
	crash(t, db)
	f, err := os.OpenFile(first, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{0xff}, 9); err != nil { // inside the first record's payload
		t.Fatal(err)
	}
	f.Close()
	_, err = OpenAgent(ctx, path, append(held(), WithIntake())...)
	if err == nil || !strings.Contains(err.Error(), "damaged") {
		t.Fatalf("open: %v, want the damage reported", err)
	}
}

// A write the disk refuses leaves nothing behind: the call fails, the next
// one is saved, and the store holds exactly what was saved.
func TestIntakeFailedWriteLeavesNothing(t *testing.T) {
	holdApplies(t)
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agent.db")
	disk := &faultDisk{}
	db := openIntakeDB(t, path, withDisk(disk))
	full := true
	disk.setWriteAt(func(f *os.File, b []byte, off int64) (int, error) {
		if full {
			// Half the frames reach the file before the disk is full.
			n, _ := f.WriteAt(b[:len(b)/2], off)
			return n, syscall.ENOSPC
		}
		return f.WriteAt(b, off)
	})
	a, b := testCapture(1, []byte(`{"a":1}`)), testCapture(2, []byte(`{"b":2}`))
	if _, err := db.LogCaptures(ctx, []*Capture{a, b}, nil); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("a full disk: %v", err)
	}
	if n := db.intake.npending.Load(); n != 0 {
		t.Fatalf("%d records pending after a failed write", n)
	}
	full = false
	c := testCapture(3, []byte(`{"c":3}`))
	if _, err := db.LogCaptures(ctx, []*Capture{c}, nil); err != nil {
		t.Fatal(err)
	}
	crash(t, db)
	db = openIntakeDB(t, path)
	defer db.Close()
	got, n, err := db.Captures(ctx, CaptureFilter{Page: Page{Limit: 10}})
	if err != nil || n != 1 || got[0].ID != c.ID {
		t.Fatalf("after the restart: %d captures (%v), want only %s", n, err, c.ID)
	}
}

// The intake writer of TestIntakeKilledMidBatch: saves batches of
// captures, printing each id once LogCaptures has returned, until killed.
func TestIntakeWriterProcess(t *testing.T) {
	dir := os.Getenv("CALLTAP_INTAKE_WRITER")
	if dir == "" {
		return // run by TestIntakeKilledMidBatch only
	}
	// Applies all the time: the kill may land in one.
	db, err := OpenAgent(context.Background(), filepath.Join(dir, "agent.db"), WithIntake(), withApplyDelay(time.Millisecond))
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	out := bufio.NewWriter(os.Stdout)
	for n := 1; ; {
		var batch []*Capture
		for range 1 + n%17 {
			batch = append(batch, testCapture(n, []byte(writerBody(n))))
			n++
		}
		if _, err := db.LogCaptures(context.Background(), batch, nil); err != nil {
			fmt.Fprintln(out, "error", err)
			out.Flush()
			os.Exit(1)
		}
		for _, c := range batch {
			fmt.Fprintln(out, "saved", c.ID)
		}
		out.Flush()
	}
}

func writerBody(n int) string {
	return fmt.Sprintf(`{"n":%d,"pad":"%s"}`, n, strings.Repeat("x", n%900))
}

// SIGKILL while the agent's log is written and applied: every capture whose
// save returned is in the store after the restart, exactly once, and a
// second restart changes nothing.
func TestIntakeKilledMidBatch(t *testing.T) {
	for round := range 3 {
		dir := t.TempDir()
		cmd := exec.Command(os.Args[0], "-test.run=^TestIntakeWriterProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), "CALLTAP_INTAKE_WRITER="+dir)
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		saved := map[string]bool{}
		sc := bufio.NewScanner(stdout)
		want := 500 + 400*round
		for len(saved) < want && sc.Scan() {
			line := sc.Text()
			id, ok := strings.CutPrefix(line, "saved ")
			if !ok {
				t.Fatalf("writer: %s", line)
			}
			saved[id] = true
		}
		cmd.Process.Kill()
		for sc.Scan() { // what it printed before the kill landed
			if id, ok := strings.CutPrefix(sc.Text(), "saved "); ok {
				saved[id] = true
			}
		}
		cmd.Wait()
		if len(saved) < want {
			t.Fatalf("the writer stopped after %d saves", len(saved))
		}
		path := filepath.Join(dir, "agent.db")
		pendingAtKill := unapplied(t, path)
		var counts []int
		for range 2 {
			db, err := OpenAgent(context.Background(), path)
			if err != nil {
				t.Fatal(err)
			}
			rows, err := db.read.Query(`SELECT id, count(*) FROM captures GROUP BY id`)
			if err != nil {
				t.Fatal(err)
			}
			found := map[string]int{}
			for rows.Next() {
				var id string
				var n int
				if err := rows.Scan(&id, &n); err != nil {
					t.Fatal(err)
				}
				found[id] = n
			}
			rows.Close()
			for id := range saved {
				if found[id] != 1 {
					t.Fatalf("round %d: %s was saved and is in the store %d times", round, id, found[id])
				}
			}
			for id, n := range found {
				if n != 1 {
					t.Fatalf("round %d: %s is in the store %d times", round, id, n)
				}
			}
			// Each body reads back byte-exact, from where the log wrote it.
			for id := range saved {
				c, err := db.Capture(context.Background(), id)
				if err != nil {
					t.Fatalf("round %d: %s: %v", round, id, err)
				}
				n, _ := strconv.Atoi(id[len(id)-12:])
				if want := writerBody(n); string(c.Body) != want {
					t.Fatalf("round %d: %s: body %q, want %q", round, id, c.Body, want)
				}
			}
			counts = append(counts, len(found))
			db.Close()
		}
		if counts[0] != counts[1] {
			t.Fatalf("round %d: the second restart changed the store: %d then %d captures", round, counts[0], counts[1])
		}
		t.Logf("round %d: %d saves seen, %d captures after the restart, %d bytes of log unapplied at the kill", round, len(saved), counts[0], pendingAtKill)
	}
}

// unapplied is how many bytes of records the store's log holds past its
// recorded position, read before anything opens the store.
func unapplied(t *testing.T, path string) int64 {
	t.Helper()
	db, err := sql.Open("sqlite3", "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var gen, off int64
	if err := db.QueryRow(`SELECT applied_gen, applied_end FROM intake_state`).Scan(&gen, &off); err != nil {
		t.Fatal(err)
	}
	gens, err := intake.Files(BodiesDir(path))
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, g := range gens {
		if g < gen {
			continue
		}
		start := int64(0)
		if g == gen {
			start = off
		}
		s, err := intake.ReadLog(filepath.Join(BodiesDir(path), intake.Name(g)), start)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range s.Records {
			total += int64(len(r.Payload)) + 8
		}
	}
	return total
}

// Past a file's room the log moves to the next generation's file, made
// ahead; every body reads back from whichever file holds it, across a
// restart, and once nothing names the old files they go.
func TestIntakeRotates(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agent.db")
	db := openIntakeDB(t, path)
	body := func(n int) []byte {
		return []byte(fmt.Sprintf(`{"n":%d,"pad":"%s"}`, n, strings.Repeat("r", 4000)))
	}
	var ids []string
	const total = 4000 // 16 MB: past two files of 7 MiB, into a third
	for n := 0; n < total; n += 10 {
		var batch []*Capture
		for i := n; i < n+10; i++ {
			c := testCapture(i, body(i))
			batch = append(batch, c)
			ids = append(ids, c.ID)
		}
		if _, err := db.LogCaptures(ctx, batch, nil); err != nil {
			t.Fatal(err)
		}
	}
	if g := db.intake.log.Gen(); g < 3 {
		t.Fatalf("the log is at generation %d after 16 MB, want a third file", g)
	}
	check := func(when string) {
		t.Helper()
		for i, id := range ids {
			c, err := db.Capture(ctx, id)
			if err != nil {
				t.Fatalf("%s: %s: %v", when, id, err)
			}
			if !bytes.Equal(c.Body, body(i)) {
				t.Fatalf("%s: %s: body of %d bytes differs", when, id, len(c.Body))
			}
		}
	}
	check("written")
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = openIntakeDB(t, path)
	defer db.Close()
	check("reopened")
	before, _ := filepath.Glob(filepath.Join(BodiesDir(path), intake.Prefix+"*.log"))
	if _, err := db.DeleteCaptures(ctx, ids...); err != nil {
		t.Fatal(err)
	}
	after, _ := filepath.Glob(filepath.Join(BodiesDir(path), intake.Prefix+"*.log"))
	if len(before) < 3 || len(after) != 1 || after[0] != db.intake.log.Path(db.intake.log.Gen()) {
		t.Fatalf("logs before the delete %v, after %v: want only the one appended to left", before, after)
	}
}

// A record decodes to what was encoded: negative numbers, a nil response
// body apart from an empty one, a zero time.
func TestIntakeRecordCodec(t *testing.T) {
	for _, u := range []*Capture{
		{ID: "a", Status: StatusFailed, Duration: -1, Error: "timed out", Attempts: 2, MaxAttempts: 5},
		{ID: "b", Status: StatusDelivered, ResponseStatus: 204, ResponseBody: []byte{}, Duration: 1500 * time.Microsecond,
			DeliveredAt: capT0, Queued: true, ArrivedAt: capT0.Add(-time.Hour),
			LastAttempt: &Attempt{N: 2, At: capT0, ResponseStatus: 204, Duration: 1500 * time.Microsecond}},
	} {
		_, rec := intake.AppendFrame(nil, func(b []byte) []byte { return encodeUpdate(b, u) })
		kind, got, _, err := decodeRecord(rec)
		if err != nil || kind != recUpdate {
			t.Fatalf("%s: kind %d, %v", u.ID, kind, err)
		}
		if got.Duration != u.Duration || got.Error != u.Error || got.Attempts != u.Attempts || got.MaxAttempts != u.MaxAttempts ||
			(got.ResponseBody == nil) != (u.ResponseBody == nil) || !got.DeliveredAt.Equal(u.DeliveredAt) || got.Queued != u.Queued ||
			!got.ArrivedAt.Equal(u.ArrivedAt) || (got.LastAttempt == nil) != (u.LastAttempt == nil) {
			t.Fatalf("%s: decoded %+v, encoded %+v", u.ID, got, u)
		}
		if u.LastAttempt != nil && *got.LastAttempt != *u.LastAttempt {
			t.Fatalf("%s: attempt %+v, want %+v", u.ID, *got.LastAttempt, *u.LastAttempt)
		}
	}
	if _, _, _, err := decodeRecord([]byte{recUpdate, 0xff}); err == nil {
		t.Fatal("a truncated record decoded")
	}
}

// Large bodies a call logs are all in their segment, synced, before the
// log's records name them: one sync of the segment holding both.
func TestIntakeSyncsLargeBodiesFirst(t *testing.T) {
	holdApplies(t)
	ctx := context.Background()
	disk := &faultDisk{}
	db := openIntakeDB(t, filepath.Join(t.TempDir(), "agent.db"), withDisk(disk))
	defer db.Close()
	big := bytes.Repeat([]byte("y"), intake.BodyMin)
	a, b := testCapture(1, big), testCapture(2, big)
	var sizes []int64
	disk.setSync(func(f *os.File) error {
		fi, err := f.Stat()
		if err != nil {
			return err
		}
		if fi.Mode().IsRegular() { // not the folder, synced for a new segment's name
			sizes = append(sizes, fi.Size())
		}
		if logSize(db) != 0 {
			t.Errorf("the segment was synced after the log took records (%d bytes)", logSize(db))
		}
		return f.Sync()
	})
	if _, err := db.LogCaptures(ctx, []*Capture{a, b}, nil); err != nil {
		t.Fatal(err)
	}
	if a.bodyFile == "" || a.bodyFile != b.bodyFile {
		t.Fatalf("bodies in %q and %q, want one segment", a.bodyFile, b.bodyFile)
	}
	if len(sizes) != 1 || sizes[0] < b.bodyOffset+int64(len(big)) {
		t.Fatalf("segment syncs at sizes %v, want one past the second body's end %d", sizes, b.bodyOffset+int64(len(big)))
	}
	for _, c := range []*Capture{a, b} {
		got, err := db.Capture(ctx, c.ID)
		if err != nil || !bytes.Equal(got.Body, big) {
			t.Fatalf("%s: %d bytes (%v)", c.ID, len(got.Body), err)
		}
	}
}

// readCounter counts the duplicate checks that read SQLite.
type readCounter struct {
	deliveryIndex
	n atomic.Int64
}

func (r *readCounter) firstOfDelivery(ctx context.Context, d string) (string, error) {
	r.n.Add(1)
	return r.deliveryIndex.firstOfDelivery(ctx, d)
}

func (r *readCounter) count() int64 { return r.n.Load() }

// countReads makes in count its duplicate checks that read SQLite.
func countReads(in *intakeLog) *readCounter {
	r := &readCounter{deliveryIndex: in.committed}
	in.mu.Lock()
	in.committed = r
	in.mu.Unlock()
	return r
}

// Once the delivery-id filter is built, a new id is checked without a
// SQLite read, and a repeat, of a capture saved before this open or since,
// is still found.
func TestIntakeDeliveryFilter(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agent.db")
	old := testCapture(1, []byte(`{"n":1}`))
	db := openAgentAt(t, path)
	saveCaptures(t, db, old)
	db.Close()

	db = openIntakeDB(t, path)
	defer db.Close()
	reads := countReads(db.intake)
	<-db.intake.filterDone
	if db.intake.ids == nil {
		t.Fatal("the filter was not built")
	}
	imported := testCapture(2, []byte(`{"n":2}`)) // straight to SQLite, as an import
	saveCaptures(t, db, imported)
	var fresh []*Capture
	for i := range 200 {
		fresh = append(fresh, testCapture(100+i, []byte(`{}`)))
	}
	if _, err := db.LogCaptures(ctx, fresh, nil); err != nil {
		t.Fatal(err)
	}
	if n := reads.count(); n > 2 {
		t.Fatalf("%d of 200 new delivery ids were checked in SQLite", n)
	}
	for k, first := range []*Capture{old, imported, fresh[7]} {
		again := testCapture(1000+k, []byte(`{"again":true}`))
		again.DeliveryID = first.DeliveryID
		w, err := db.LogCaptures(ctx, []*Capture{again}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if w[0].DuplicateOf != first.ID {
			t.Fatalf("a repeat of %s: duplicate_of %q", first.DeliveryID, w[0].DuplicateOf)
		}
	}
}

// A delivery that comes three times, the first copy applied before the
// second and third are logged: both repeats are duplicate_of the first,
// not the third of the second (the look-up took the pending second for
// the first: found by the chaos run, team seeds 21 and 41).
func TestThirdCopyIsDuplicateOfTheFirst(t *testing.T) {
	ctx := context.Background()
	holdApplies(t)
	db := openIntakeDB(t, filepath.Join(t.TempDir(), "agent.db"))
	t.Cleanup(func() { db.Close() }) // before holdApplies' cleanup, which applyLoop reads
	first, second, third := testCapture(1, []byte(`{"n":1}`)), testCapture(2, []byte(`{"n":1}`)), testCapture(3, []byte(`{"n":1}`))
	second.DeliveryID, third.DeliveryID = first.DeliveryID, first.DeliveryID
	if _, err := db.LogCaptures(ctx, []*Capture{first}, nil); err != nil {
		t.Fatal(err)
	}
	if err := db.intake.catchUp(ctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*Capture{second, third} {
		w, err := db.LogCaptures(ctx, []*Capture{c}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if w[0].DuplicateOf != first.ID {
			t.Errorf("%s: duplicate_of %q, want the first copy %s", c.ID, w[0].DuplicateOf, first.ID)
		}
	}
	// Once the repeats are applied, the look-up holds nothing of them.
	if err := db.intake.catchUp(ctx); err != nil {
		t.Fatal(err)
	}
	db.intake.mu.Lock()
	left := len(db.intake.byDeliver)
	db.intake.mu.Unlock()
	if left != 0 {
		t.Errorf("%d delivery ids still looked up in memory after every record was applied", left)
	}
}

// A queued request whose write failed is not a redelivery when the relay
// sends it again, nor is a later copy of its delivery a duplicate of it:
// the failed write leaves no trace in the duplicate check.
func TestIntakeFailedWriteIsNoRedelivery(t *testing.T) {
	holdApplies(t)
	ctx := context.Background()
	disk := &faultDisk{}
	db := openIntakeDB(t, filepath.Join(t.TempDir(), "agent.db"), withDisk(disk))
	defer db.Close()
	full := true
	disk.setWriteAt(func(f *os.File, b []byte, off int64) (int, error) {
		if full {
			return 0, syscall.ENOSPC
		}
		return f.WriteAt(b, off)
	})
	c := testCapture(1, []byte(`{"a":1}`))
	c.Queued, c.RelayID = true, "r-1"
	if _, err := db.LogCaptures(ctx, []*Capture{c}, nil); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("a full disk: %v", err)
	}
	full = false
	w, err := db.LogCaptures(ctx, []*Capture{c}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if w[0].Redelivered || w[0].DuplicateOf != "" {
		t.Fatalf("the request sent again after a failed write: %+v, want a new capture", w[0])
	}
	if _, err := db.Capture(ctx, c.ID); err != nil {
		t.Fatalf("the capture: %v", err)
	}
}

// An apply that moves past a log file deletes it when no capture names
// it, and never the file appended to, though none names it either: what
// is logged next is in it, and survives a crash.
func TestIntakeApplyDropsOnlyTheFilesItLeft(t *testing.T) {
	holdApplies(t)
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agent.db")
	db := openIntakeDB(t, path)
	c := testCapture(1, nil) // no body: no capture names a log file
	if _, err := db.LogCaptures(ctx, []*Capture{c}, nil); err != nil {
		t.Fatal(err)
	}
	// Answers of 200 KB (kept in the database's rows) until the log moves
	// on to its next file.
	first := db.intake.log.Gen()
	u := answeredCapture(c)
	u.ResponseBody = bytes.Repeat([]byte("a"), 200<<10)
	for db.intake.log.Gen() == first {
		if _, err := db.LogCaptures(ctx, nil, []*Capture{u}); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.intake.catchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(db.intake.log.Path(first)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the log applied and left, named by no capture: %v, want it deleted", err)
	}
	if _, err := os.Stat(db.intake.log.Path(db.intake.log.Gen())); err != nil {
		t.Fatalf("the log appended to: %v", err)
	}
	next := testCapture(2, nil)
	if _, err := db.LogCaptures(ctx, []*Capture{next}, nil); err != nil {
		t.Fatal(err)
	}
	crash(t, db)
	db = openIntakeDB(t, path)
	defer db.Close()
	if _, err := db.Capture(ctx, next.ID); err != nil {
		t.Fatalf("the capture logged after the apply, after a crash: %v", err)
	}
}

// Captures applied in a batch whose records span two log files reach the
// search index in the background like any others, before any search asks:
// the apply that drops the older file tells the indexer what it saved.
func TestIntakeApplyAcrossLogsIsIndexed(t *testing.T) {
	holdApplies(t)
	ctx := context.Background()
	db := openIntakeDB(t, filepath.Join(t.TempDir(), "agent.db"))
	defer db.Close()
	c := testCapture(1, []byte(`{"note":"zebra"}`))
	if _, err := db.LogCaptures(ctx, []*Capture{c}, nil); err != nil {
		t.Fatal(err)
	}
	first := db.intake.log.Gen()
	u := answeredCapture(c)
	u.ResponseBody = bytes.Repeat([]byte("a"), 200<<10)
	for db.intake.log.Gen() == first {
		if _, err := db.LogCaptures(ctx, nil, []*Capture{u}); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.intake.catchUp(ctx); err != nil { // one batch, from the first file into the next
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var upto int64
		if err := db.read.QueryRowContext(ctx, `SELECT indexed_upto FROM search.search_progress`).Scan(&upto); err != nil {
			t.Fatal(err)
		}
		if upto >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the applied capture was never indexed in the background")
		}
	}
	if got := searchIDs(t, db, "zebra"); !slices.Equal(got, []string{c.ID}) {
		t.Fatalf("search for the applied capture: %v, want [%s]", got, c.ID)
	}
}

// An apply keeps to the indexer's pace as a direct write does: with the
// backlog past its bound, the writer's lead spent and the index held by
// another connection, records logged stay pending until the indexer moves
// (here until the caller gives up), and then they are applied.
func TestIntakeApplyWaitsForTheIndex(t *testing.T) {
	holdApplies(t)
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agent.db")
	// A bound of 0 and no lead: past the bound, the writer waits for the
	// indexer.
	db := openIntakeDB(t, path, WithSearchBacklogMax(0), withPace(func(p *searchindex.Pace) { p.Lead = 0 }))
	defer db.Close()
	unlock := lockSearchIndex(t, path)
	defer unlock() // before Close, which applies what is pending
	// A backlog of one past the bound, the lead spent, the index held.
	saveCaptures(t, db, testCapture(0, []byte(`{"city":"Austin"}`)))
	var logged []*Capture
	for i := 1; i <= 10; i++ { // fewer than applyBatch: applyLoop waits its delay
		logged = append(logged, testCapture(i, []byte(`{"city":"Austin"}`)))
	}
	if _, err := db.LogCaptures(ctx, logged, nil); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if err := db.intake.catchUp(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("applying past the bound with the lead spent and the index held: %v, want it to wait until the deadline", err)
	}
	if n, backlog := db.intake.npending.Load(), db.SearchBacklog(); n != 10 || backlog != 1 {
		t.Fatalf("%d records pending and a backlog of %d, want 10 and 1", n, backlog)
	}
	unlock() // the indexer moves
	if err := db.intake.catchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if n := countCaptures(t, db); n != 11 {
		t.Fatalf("%d captures once the indexer moved, want 11", n)
	}
}

// While the intake log takes captures, the background indexer leaves a
// backlog within its bound alone: it indexes once the writer has been idle
// for its idle time, counted from the latest capture logged, not from the
// latest apply.
func TestIntakeLoggingKeepsTheIndexerWaiting(t *testing.T) {
	for range 5 {
		if judged := loggingKeepsTheIndexerWaiting(t); judged {
			return
		}
	}
	t.Fatal("in 5 tries, logging the second capture never took less than the indexer's idle time")
}

// loggingKeepsTheIndexerWaiting is one try of the test above; it is not
// judged when logging the second capture took so long that the indexer
// may have begun before it.
func loggingKeepsTheIndexerWaiting(t *testing.T) (judged bool) {
	t.Helper()
	holdApplies(t)
	ctx := context.Background()
	const idle = 600 * time.Millisecond
	db := openIntakeDB(t, filepath.Join(t.TempDir(), "agent.db"), withPace(func(p *searchindex.Pace) { p.Idle = idle }))
	defer db.Close()
	if _, err := db.LogCaptures(ctx, []*Capture{testCapture(1, []byte(`{"city":"Austin"}`))}, nil); err != nil {
		t.Fatal(err)
	}
	applying := time.Now()
	if err := db.intake.catchUp(ctx); err != nil { // applied: a backlog of one, and the indexer waits
		t.Fatal(err)
	}
	time.Sleep(idle / 4) // the writer quiet for a while, not long enough
	logging := time.Now()
	if _, err := db.LogCaptures(ctx, []*Capture{testCapture(2, []byte(`{"city":"Austin"}`))}, nil); err != nil {
		t.Fatal(err) // stays pending: only capture 1 is there to index
	}
	if time.Since(applying) >= idle {
		return false
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var upto int64
		if err := db.read.QueryRowContext(ctx, `SELECT indexed_upto FROM search.search_progress`).Scan(&upto); err != nil {
			t.Fatal(err)
		}
		if upto > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the backlog was never indexed")
		}
	}
	if quiet := time.Since(logging); quiet < idle {
		t.Fatalf("indexed %v after a capture was logged, want the writer idle for %v first", quiet, idle)
	}
	return true
}

// applyBatch records waiting are applied at once, without the delay that
// gathers the records of a quiet spell (here an hour).
func TestIntakeFullBatchAppliedAtOnce(t *testing.T) {
	holdApplies(t)
	ctx := context.Background()
	db := openIntakeDB(t, filepath.Join(t.TempDir(), "agent.db"))
	defer db.Close()
	var cs []*Capture
	for i := range applyBatch {
		cs = append(cs, testCapture(i, []byte(`{}`)))
	}
	if _, err := db.LogCaptures(ctx, cs, nil); err != nil {
		t.Fatal(err)
	}
	// The deadline bounds a hang.
	for deadline := time.Now().Add(10 * time.Second); db.intake.npending.Load() > 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of a full batch still pending after 10 s", db.intake.npending.Load())
		}
	}
}

// An apply drops only the log files wholly before the position it
// reached: the file it stopped in still holds records to apply, even once
// the log appends to a newer one. Here the next batch cannot be applied
// (the search backlog is past its bound, the writer's lead spent) and the
// process is killed; the next open applies them from that file.
func TestIntakeApplyKeepsTheFileItStoppedIn(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agent.db")
	// A bound of 0 and a lead of one batch left to the writer, the index
	// held: the indexer never moves.
	db := openIntakeDB(t, path, WithSearchBacklogMax(0), withPace(func(p *searchindex.Pace) { p.Lead = applyBatch }))
	unlock := lockSearchIndex(t, path)
	defer unlock()
	in := db.intake
	close(in.stop) // no applyLoop: the test applies
	<-in.done
	direct := testCapture(0, []byte(`{}`))
	saveCaptures(t, db, direct)
	logOne := func(inserts, updates []*Capture) {
		t.Helper()
		if _, err := db.LogCaptures(ctx, inserts, updates); err != nil {
			t.Fatal(err)
		}
	}
	// The first batch: one insert (no body: no capture names a log file),
	// answers of 200 KB into the second file, small ones to applyBatch.
	c := testCapture(1, nil)
	logOne([]*Capture{c}, nil)
	big, small := answeredCapture(c), answeredCapture(c)
	big.ResponseBody = bytes.Repeat([]byte("a"), 200<<10)
	records := 1
	for gen := in.log.Gen(); in.log.Gen() == gen; records++ {
		logOne(nil, []*Capture{big})
	}
	for ; records < applyBatch; records++ {
		logOne(nil, []*Capture{small})
	}
	// After it, in the same file: an answer only it holds; then the log
	// moves on to a third file.
	answer := answeredCapture(direct)
	logOne(nil, []*Capture{answer})
	stoppedIn := in.log.Gen()
	for in.log.Gen() == stoppedIn {
		logOne(nil, []*Capture{big})
	}
	// A backlog past the bound, and the lead of one batch: the second
	// batch waits for an indexer that never moves.
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if err := in.catchUp(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("applying with the index held past its bound: %v, want the second batch to wait", err)
	}
	if in.applied.gen != stoppedIn {
		t.Fatalf("the first batch ended in log %d, want %d", in.applied.gen, stoppedIn)
	}
	unlock() // the store closes without waiting for the index's lock
	// Killed: nothing more applied.
	in.mu.Lock()
	in.closed = true
	in.mu.Unlock()
	in.log.Close()
	in.lock.Close()
	db.intake = nil
	if err := db.closeStore(); err != nil {
		t.Fatal(err)
	}
	db = openIntakeDB(t, path)
	defer db.Close()
	got, err := db.Capture(ctx, answer.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.ResponseStatus != answer.ResponseStatus {
		t.Fatalf("the answer logged after the applied batch, after a kill: status %d, want %d", got.ResponseStatus, answer.ResponseStatus)
	}
}
