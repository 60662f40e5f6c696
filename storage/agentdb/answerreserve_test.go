package agentdb

import (
	"context"
	"path/filepath"
	"testing"
	"time"
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
