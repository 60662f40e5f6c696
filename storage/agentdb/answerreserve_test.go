package agentdb

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/calltap/calltap/storage/disktest"
	"github.com/calltap/calltap/storage/intake"
)

// Answers spilled into the reserve at a stop are recorded by the next
// start, once, in order; one of a capture deleted meanwhile is passed
// over; the reserve stays its full size, ready for the next stop.
func TestAnswerReserveKeepsAnswersForTheNextStart(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agent.db")
	db := openIntakeDB(t, path)
	if err := db.ReserveAnswers(); err != nil {
		t.Fatal(err)
	}
	a, b, gone := testCapture(1, []byte(`{"n":1}`)), testCapture(2, []byte(`{"n":2}`)), testCapture(3, []byte(`{"n":3}`))
	if _, err := db.LogCaptures(ctx, []*Capture{a, gone, b}, nil); err != nil {
		t.Fatal(err)
	}
	answer := func(c *Capture, status int) *Capture {
		u := *c
		u.Status, u.ResponseStatus, u.ResponseBody, u.Attempts = StatusDelivered, status, []byte("ok"), 1
		u.Duration, u.DeliveredAt = time.Millisecond, time.Now().UTC()
		u.LastAttempt = &Attempt{N: 1, At: u.DeliveredAt, ResponseStatus: status, Duration: time.Millisecond}
		return &u
	}
	// Two answers of a: the later one is what the store keeps.
	n, err := db.SpillAnswers([]*Capture{answer(a, 500), answer(a, 201), answer(b, 202), answer(gone, 200)})
	if err != nil || n != 4 {
		t.Fatalf("spilled %d: %v", n, err)
	}
	if _, err := db.DeleteCaptures(ctx, gone.ID); err != nil {
		t.Fatal(err)
	}
	db.Close()

	db = openIntakeDB(t, path)
	defer db.Close()
	if n, err := db.RecoverAnswers(ctx); err != nil || n != 3 {
		t.Fatalf("recovered %d: %v; want 3 (the deleted capture's passed over)", n, err)
	}
	for c, want := range map[*Capture]int{a: 201, b: 202} {
		got, err := db.Capture(ctx, c.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.Status != StatusDelivered || got.ResponseStatus != want || string(got.ResponseBody) != "ok" {
			t.Errorf("%s: %s %d %q, want delivered %d", c.ID, got.Status, got.ResponseStatus, got.ResponseBody, want)
		}
	}
	if n, err := db.RecoverAnswers(ctx); err != nil || n != 0 {
		t.Errorf("a second start recovered %d: %v", n, err)
	}
	if err := db.ReserveAnswers(); err != nil {
		t.Fatal(err)
	}
}

// spilledAnswer is an answer of c whose frame in the reserve is frame
// bytes long.
func spilledAnswer(t *testing.T, c *Capture, frame int) *Capture {
	t.Helper()
	u := answeredCapture(c)
	for range 3 { // the body's length prefix may grow by a byte or two
		b, _ := intake.AppendFrame(nil, func(b []byte) []byte { return encodeUpdate(b, u) })
		if len(b) == frame {
			return u
		}
		u.ResponseBody = bytes.Repeat([]byte("a"), len(u.ResponseBody)+frame-len(b))
	}
	t.Fatalf("no answer makes a frame of %d bytes", frame)
	return nil
}

// The reserve takes answers up to its end, the zero frame that ends them
// included: one that fits exactly is spilled (and recorded at the next
// start); one that leaves no room for the zero frame is not, and the
// reserve keeps its size.
func TestSpillAnswersUpToTheReserveEnd(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agent.db")
	db := openIntakeDB(t, path)
	if err := db.ReserveAnswers(); err != nil {
		t.Fatal(err)
	}
	c := testCapture(1, []byte(`{"n":1}`))
	if _, err := db.LogCaptures(ctx, []*Capture{c}, nil); err != nil {
		t.Fatal(err)
	}
	if n, err := db.SpillAnswers([]*Capture{spilledAnswer(t, c, intake.ReserveSize)}); err != nil || n != 0 {
		t.Errorf("an answer as large as the reserve: spilled %d (%v), want 0", n, err)
	}
	if fi, err := os.Stat(db.answerReservePath()); err != nil || fi.Size() != intake.ReserveSize {
		t.Fatalf("the reserve after the spill: %v, want %d bytes", fi.Size(), intake.ReserveSize)
	}
	fits := spilledAnswer(t, c, intake.ReserveSize-8)
	if n, err := db.SpillAnswers([]*Capture{fits}); err != nil || n != 1 {
		t.Fatalf("an answer that fits exactly: spilled %d (%v), want 1", n, err)
	}
	db.Close()
	db = openIntakeDB(t, path)
	defer db.Close()
	if n, err := db.RecoverAnswers(ctx); err != nil || n != 1 {
		t.Fatalf("recovered %d: %v; want 1", n, err)
	}
	if got, err := db.Capture(ctx, c.ID); err != nil || !bytes.Equal(got.ResponseBody, fits.ResponseBody) {
		t.Errorf("the recovered answer: %v", err)
	}
}

// A second ReserveAnswers (a start that did not recover first) leaves the
// answers a reserve holds: only a missing or short reserve is written.
func TestReserveAnswersKeepsWhatTheReserveHolds(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agent.db")
	db := openIntakeDB(t, path)
	defer db.Close()
	if err := db.ReserveAnswers(); err != nil {
		t.Fatal(err)
	}
	c := testCapture(1, []byte(`{"n":1}`))
	if _, err := db.LogCaptures(ctx, []*Capture{c}, nil); err != nil {
		t.Fatal(err)
	}
	if n, err := db.SpillAnswers([]*Capture{answeredCapture(c)}); err != nil || n != 1 {
		t.Fatalf("spilled %d: %v", n, err)
	}
	if err := db.ReserveAnswers(); err != nil {
		t.Fatal(err)
	}
	if n, err := db.RecoverAnswers(ctx); err != nil || n != 1 {
		t.Fatalf("recovered %d: %v; want the 1 spilled before the second ReserveAnswers", n, err)
	}
}

// On a disk with less than four times the reserve free, no reserve is
// made: it must never be what fills the disk.
func TestReserveAnswersNeedsRoom(t *testing.T) {
	dir := disktest.Dir(t, 32<<20)
	db, err := OpenAgent(context.Background(), filepath.Join(dir, "agent.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	disktest.Fill(t, dir, 2*intake.ReserveSize)
	if err := db.ReserveAnswers(); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("a reserve with 2 MiB free: %v, want ENOSPC", err)
	}
	if _, err := os.Stat(db.answerReservePath()); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the reserve on a nearly full disk: %v, want none", err)
	}
}
