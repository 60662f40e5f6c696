package inspector

import (
	"context"
	"slices"
	"time"

	"github.com/calltap/calltap/inspector/voice/trigger"
	"github.com/calltap/calltap/storage"
	"github.com/calltap/calltap/storage/agentdb"
)

// FindTriggerCaptures sets the CaptureID of every accepted delivery of res
// whose capture is in db, looking again for at most wait while some are
// missing: an agent records a capture just after its answer. The Nth copy
// of a delivery (trigger's Duplicate) is the Nth capture of its delivery
// id, replays aside.
func FindTriggerCaptures(ctx context.Context, db *agentdb.AgentStore, res *trigger.Result, wait time.Duration) {
	deadline := time.Now().Add(wait)
	for {
		missing := 0
		for i := range res.Deliveries {
			d := &res.Deliveries[i]
			if d.CaptureID != "" || !d.OK() {
				continue
			}
			if d.CaptureID = nthCapture(ctx, db, d.DeliveryID, d.Copy); d.CaptureID == "" {
				missing++
			}
		}
		if missing == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// nthCapture is the id of the nth (from 1) capture of a delivery, oldest
// first and replays aside; "" when there is none.
func nthCapture(ctx context.Context, db *agentdb.AgentStore, deliveryID string, n int) string {
	cs, _, err := db.Captures(ctx, agentdb.CaptureFilter{DeliveryID: deliveryID, Page: storage.Page{Limit: 20}})
	if err != nil {
		return ""
	}
	slices.Reverse(cs)
	for _, c := range cs {
		if c.ReplayOf != "" {
			continue
		}
		if n--; n <= 0 {
			return c.ID
		}
	}
	return ""
}
