package agent

import (
	"testing"
	"time"

	"github.com/calltap/calltap/relay/wire"
	"github.com/calltap/calltap/storage/agentdb"
)

// An attempt's outcome sets its capture's status by the voice service's
// rule (documentation 6.8): a 2xx is delivered; another answer is failed
// once the attempts run out or when no retry would help, and pending
// (tried again) otherwise. The attempt is timed from its start.
func TestRecordSetsStatusByTheRetryRule(t *testing.T) {
	d := openDisk(t)
	a, err := New(Config{Store: d.store, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer a.cm.answers.timer.Stop()
	for _, tc := range []struct {
		status, n, max int
		want           string
	}{
		{200, 1, 1, agentdb.StatusDelivered},
		{299, 1, 3, agentdb.StatusDelivered},
		{199, 1, 3, agentdb.StatusFailed},
		{300, 1, 3, agentdb.StatusFailed},
		{503, 1, 3, agentdb.StatusPending},
		{503, 2, 3, agentdb.StatusPending},
		{503, 3, 3, agentdb.StatusFailed},
		{0, 1, 1, agentdb.StatusFailed},
		{0, 1, 2, agentdb.StatusPending},
	} {
		c := testCapture(`{}`)
		c.MaxAttempts = tc.max
		took := 1500 * time.Millisecond
		out := a.record(c, tc.n, sendResult{status: tc.status, duration: took})
		if c.Status != tc.want || c.Attempts != tc.n || out.Status != tc.status {
			t.Errorf("status %d, attempt %d of %d: capture %s after %d attempts, relay told %d; want %s",
				tc.status, tc.n, tc.max, c.Status, c.Attempts, out.Status, tc.want)
		}
		if la := c.LastAttempt; la == nil || la.N != tc.n || la.Duration != took || !la.At.Equal(c.DeliveredAt.Add(-took)) {
			t.Errorf("status %d: last attempt %+v, delivered at %s", tc.status, la, c.DeliveredAt)
		}
		if tc.status == 0 && out.Result != wire.ResultUnreachable {
			t.Errorf("no answer: relay told %q", out.Result)
		}
	}
}
