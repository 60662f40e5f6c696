package agent

import (
	"github.com/calltap/calltap/inspector/voice/callevent"
	"github.com/calltap/calltap/storage/agentdb"
)

// IndexCapture fills the call-event columns of c from its body, so captures
// list and group by event, call and delivery without parsing bodies again.
func IndexCapture(c *agentdb.Capture) {
	ix, ok := callevent.Index(c.Body)
	if !ok {
		return
	}
	c.Event, c.CallID, c.DeliveryID, c.OccurredAt = ix.Event, ix.CallID, ix.DeliveryID, ix.OccurredAt
}
