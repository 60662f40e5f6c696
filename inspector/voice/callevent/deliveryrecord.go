package callevent

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/calltap/calltap/relay/api"
)

// DeliverySummary is the part of a webhook delivery record (section 2.3)
// that the delivery log's items carry, as the service's API serves it: the
// emulator writes it and the service's client reads it, so it is defined
// once, here. The detail view adds the payload, the response body and the
// attempts listing.
type DeliverySummary struct {
	ID             string    `json:"id"`
	Event          string    `json:"event"`
	URL            string    `json:"url"`
	Status         string    `json:"status"`
	Attempts       int       `json:"attempts"`
	MaxAttempts    int       `json:"max_attempts"`
	ResponseStatus *int      `json:"response_status"`
	Error          string    `json:"error"`
	CallID         string    `json:"call_id"`
	CreatedAt      Timestamp `json:"created_at"`
	DeliveredAt    Timestamp `json:"delivered_at"`
}

// Timestamp is an ISO 8601 time of the service's API; the zero value is
// null.
type Timestamp struct{ time.Time }

// UnmarshalJSON accepts RFC 3339 with or without fractions, and null.
func (t *Timestamp) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		t.Time = time.Time{}
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("timestamp: %w", err)
	}
	if s == "" {
		t.Time = time.Time{}
		return nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05.999999999", "2006-01-02 15:04:05.999999999Z07:00"} {
		if v, err := time.Parse(layout, s); err == nil {
			t.Time = v.UTC()
			return nil
		}
	}
	return fmt.Errorf("timestamp %q is not ISO 8601", s)
}

// MarshalJSON writes RFC 3339 in UTC with microseconds, or null.
func (t Timestamp) MarshalJSON() ([]byte, error) {
	if t.IsZero() {
		return []byte("null"), nil
	}
	return json.Marshal(api.FormatTime(t.Time))
}
