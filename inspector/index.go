package inspector

import (
	"encoding/json"

	"github.com/calltap/calltap/storage"
)

// indexCapture fills the call-event columns of c from its body.
func indexCapture(c *storage.Capture) {
	var ev struct {
		ID         string `json:"id"`
		Event      string `json:"event"`
		OccurredAt string `json:"occurred_at"`
		Call       struct {
			CallID string `json:"call_id"`
		} `json:"call"`
	}
	if len(c.Body) == 0 || c.Body[0] != '{' || json.Unmarshal(c.Body, &ev) != nil || ev.Event == "" {
		return
	}
	c.Event, c.CallID, c.DeliveryID, c.OccurredAt = ev.Event, ev.Call.CallID, ev.ID, ev.OccurredAt
}
