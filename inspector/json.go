package inspector

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"time"
	"unicode/utf8"

	"github.com/calltap/calltap/inspector/voice/callevent"
	"github.com/calltap/calltap/relay/api"
	"github.com/calltap/calltap/relay/wire"
	"github.com/calltap/calltap/storage/agentdb"
)

// Summary is a capture in a listing (and in the live stream).
type Summary struct {
	ID             string   `json:"id"`
	CreatedAt      *string  `json:"created_at"`
	Method         string   `json:"method"`
	Path           string   `json:"path"`
	Query          string   `json:"query"`
	Event          string   `json:"event"`
	CallID         string   `json:"call_id"`
	DeliveryID     string   `json:"delivery_id"`
	Status         string   `json:"status"` // pending | delivered | failed | unknown (answer unknown) | stored (stored only)
	ResponseStatus *int     `json:"response_status"`
	DurationMS     *float64 `json:"duration_ms"`
	Error          string   `json:"error"`
	ReplayOf       string   `json:"replay_of"`
	DuplicateOf    string   `json:"duplicate_of"`
	Queued         bool     `json:"queued"`
	ArrivedAt      *string  `json:"arrived_at"`
	Source         string   `json:"source"`
	Route          string   `json:"route"` // the route it took (--routes): a route's name, "default" or "filtered"; "" when none decided
	Size           int      `json:"size"`
	Attempts       int      `json:"attempts"`
	MaxAttempts    int      `json:"max_attempts"`
	Keep           bool     `json:"keep"` // retention never prunes it
}

func SummaryOf(c *agentdb.Capture) Summary {
	s := Summary{
		ID: c.ID, CreatedAt: api.Time(c.CreatedAt), Method: c.Method, Path: c.Path, Query: c.Query,
		Event: c.Event, CallID: c.CallID, DeliveryID: c.DeliveryID, Status: c.Status, Error: c.Error,
		ReplayOf: c.ReplayOf, DuplicateOf: c.DuplicateOf, Queued: c.Queued, ArrivedAt: api.Time(c.ArrivedAt),
		Source: c.Source, Route: c.Route, Size: c.Size, Attempts: c.Attempts, MaxAttempts: c.MaxAttempts, Keep: c.Keep,
	}
	if c.Body != nil {
		s.Size = len(c.Body)
	}
	if c.ResponseStatus > 0 {
		st := c.ResponseStatus
		s.ResponseStatus = &st
	}
	if c.Duration >= 0 {
		ms := float64(c.Duration.Microseconds()) / 1000
		s.DurationMS = &ms
	}
	return s
}

// AttemptJSON is one entry of a capture's attempt_log.
type AttemptJSON struct {
	N              int     `json:"n"`
	At             *string `json:"at"`
	ResponseStatus *int    `json:"response_status"`
	Error          string  `json:"error"`
	DurationMS     float64 `json:"duration_ms"`
}

// Detail is one capture in full: the delivery record of the documentation's
// section 2.3 plus what a tunnel adds.
type Detail struct {
	Summary
	URL                  string              `json:"url"`
	DeliveredAt          *string             `json:"delivered_at"`
	Payload              json.RawMessage     `json:"payload"`
	ResponseBody         string              `json:"response_body"`
	ResponseBodyEncoding string              `json:"response_body_encoding"`
	RequestHeaders       wire.Header         `json:"request_headers"`
	ResponseHeaders      wire.Header         `json:"response_headers"`
	Body                 string              `json:"body"`
	BodyEncoding         string              `json:"body_encoding"`
	Target               string              `json:"target"`
	AttemptLog           []AttemptJSON       `json:"attempt_log"`
	Replays              []Summary           `json:"replays"`
	Checks               []callevent.Finding `json:"checks"`
}

// encodeBody returns b as text when it is UTF-8, else as base64.
func encodeBody(b []byte) (string, string) {
	if utf8.Valid(b) {
		return string(b), "utf8"
	}
	return base64.StdEncoding.EncodeToString(b), "base64"
}

func detailOf(c *agentdb.Capture, attempts []agentdb.Attempt, replays []*agentdb.Capture) Detail {
	d := Detail{Summary: SummaryOf(c), DeliveredAt: api.Time(c.DeliveredAt), Target: c.Target, URL: c.Target}
	if d.URL == "" {
		d.URL = c.Path
		if c.Query != "" {
			d.URL += "?" + c.Query
		}
	}
	// JSON that is not UTF-8 would make the whole answer (or export line)
	// something JSON readers refuse: such a body is only in body, base64.
	if len(c.Body) > 0 && utf8.Valid(c.Body) && json.Valid(c.Body) {
		d.Payload = json.RawMessage(c.Body)
	} else {
		d.Payload = json.RawMessage("null")
	}
	d.Body, d.BodyEncoding = encodeBody(c.Body)
	d.ResponseBody, d.ResponseBodyEncoding = encodeBody(c.ResponseBody)
	d.RequestHeaders = wire.Header{}
	_ = d.RequestHeaders.UnmarshalJSON([]byte(c.RequestHeaders))
	d.ResponseHeaders = wire.Header{}
	if c.ResponseHeaders != "" {
		_ = d.ResponseHeaders.UnmarshalJSON([]byte(c.ResponseHeaders))
	}
	d.AttemptLog = []AttemptJSON{}
	for _, a := range attempts {
		aj := AttemptJSON{N: a.N, At: api.Time(a.At), Error: a.Error, DurationMS: float64(a.Duration.Microseconds()) / 1000}
		if a.ResponseStatus > 0 {
			st := a.ResponseStatus
			aj.ResponseStatus = &st
		}
		d.AttemptLog = append(d.AttemptLog, aj)
	}
	d.Replays = []Summary{}
	for _, r := range replays {
		d.Replays = append(d.Replays, SummaryOf(r))
	}
	return d
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		return []byte("null")
	}
	return b
}

// writeJSON writes v without the envelope (for ngrok-compatible answers).
func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Write(append(mustJSON(v), '\n'))
}

// checksOf runs the contract checks on a capture that is a call event.
func checksOf(c *agentdb.Capture) []callevent.Finding {
	if c.Event == "" {
		return []callevent.Finding{}
	}
	return callevent.CheckReceived(c.Body, receivedAt(c))
}

// receivedAt is when a capture reached calltap: at the relay for a request
// that waited in its queue, else at the agent.
func receivedAt(c *agentdb.Capture) time.Time {
	if !c.ArrivedAt.IsZero() {
		return c.ArrivedAt
	}
	return c.CreatedAt
}

// ReplayResult is the documentation's replay result (section 2.4).
type ReplayResult struct {
	ID     string `json:"id"`
	Status string `json:"status"`
	Queued bool   `json:"queued"`
}

// ReplayStatus maps a capture to the replay result's fields.
func ReplayStatus(c *agentdb.Capture, queued bool) ReplayResult {
	return ReplayResult{ID: c.ID, Status: c.Status, Queued: queued}
}
