package agentdb

import (
	"context"
	"testing"
)

// MarkInterrupted marks answer-unknown the live captures left pending, and
// those an older version marked failed with its false "the sender was not
// given it"; a real failure, and a pending queued capture, stay as they are.
func TestMarkInterruptedSaysAnswerUnknown(t *testing.T) {
	ctx := context.Background()
	db := openAgentDB(t)
	pending, old, real, queued := testCapture(1, nil), testCapture(2, nil), testCapture(3, nil), testCapture(4, nil)
	for _, c := range []*Capture{pending, old, real, queued} {
		c.Status, c.MaxAttempts = StatusPending, 1
	}
	queued.Queued = true
	saveCaptures(t, db, pending, old, real, queued)
	o, r := *old, *real
	o.Status, o.Error = StatusFailed, "interrupted: the agent stopped before the handler's answer was recorded; the sender was not given it, and sends the request again"
	r.Status, r.Error, r.Attempts = StatusFailed, "connection refused", 1
	if _, err := db.WriteCaptures(ctx, nil, []*Capture{&o, &r}); err != nil {
		t.Fatal(err)
	}
	n, err := db.MarkInterrupted(ctx, "answer unknown: test")
	if err != nil || n != 2 {
		t.Fatalf("marked %d: %v; want 2", n, err)
	}
	for c, want := range map[*Capture]string{pending: StatusUnknown, old: StatusUnknown, real: StatusFailed, queued: StatusPending} {
		got, err := db.Capture(ctx, c.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.Status != want {
			t.Errorf("%s: %s %q, want %s", c.ID, got.Status, got.Error, want)
		}
	}
}
