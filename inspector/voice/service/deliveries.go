package service

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/calltap/calltap/relay/api"
)

// Timestamp is an ISO 8601 time from the API; the zero value is null.
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

// Delivery is a webhook delivery record (documentation 2.3). Items of the
// delivery log carry the summary fields; GET /webhooks/{id}/ adds Payload,
// ResponseBody and the attempts listing.
type Delivery struct {
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

	// Payload is the exact bytes that were sent, as the service served
	// them (never re-encoded). Empty in items of the log.
	Payload      json.RawMessage `json:"payload,omitempty"`
	ResponseBody string          `json:"response_body,omitempty"`
	// AttemptLog is the attempts listing the documentation names without
	// giving its shape; read from the emulator's attempt_log.
	AttemptLog []Attempt `json:"attempt_log,omitempty"`
}

// Attempt is one entry of a delivery's attempts listing.
type Attempt struct {
	N              int       `json:"n"`
	At             Timestamp `json:"at"`
	ResponseStatus *int      `json:"response_status"`
	Error          string    `json:"error"`
	DurationMS     float64   `json:"duration_ms"`
}

// Filter narrows the delivery log.
type Filter struct {
	CallID string // the documented call_id filter
	// Since drops deliveries created before it. The log has no date filter,
	// so this is applied here; the walk stops early once the pages, newest
	// first, have gone past it.
	Since time.Time
	// PageSize is the limit asked for; 0 asks for PageSize (200). The walk
	// follows whatever limit comes back.
	PageSize int
}

// Progress reports a walk after each page.
type Progress struct {
	Pages  int // pages read
	Count  int // the log's count on the last page
	Seen   int // distinct deliveries read so far
	Offset int // the next offset
}

// Deliveries walks the delivery log as section 4.7 says: the limit each
// page comes back with moves the offset, and the walk stops once the offset
// reaches count (or a page comes back empty). Offsets are positions, not
// bookmarks: rows created during the walk push others down, so rows are
// de-duplicated by id, and once the walk ends its head is read again until
// a page holds only known rows ("page newest-first and stop at a known
// record"), so that rows created meanwhile are not missed. progress, when
// set, is called after each page.
func (c *Client) Deliveries(ctx context.Context, f Filter, progress func(Progress)) ([]Delivery, error) {
	size := f.PageSize
	if size <= 0 {
		size = PageSize
	}
	q := url.Values{}
	if f.CallID != "" {
		q.Set("call_id", f.CallID)
	}
	q.Set("limit", strconv.Itoa(size))

	var (
		out     []Delivery
		seen    = map[string]bool{}
		p       Progress
		ordered = true // every new row so far came newest first
		last    time.Time
		counts  = map[int]bool{} // every count the pages gave
	)
	// page reads one page and reports how many of its rows were new.
	page := func(offset int) (rows []Delivery, fresh int, limit, count int, err error) {
		q.Set("offset", strconv.Itoa(offset))
		var pg struct {
			Count   int        `json:"count"`
			Limit   int        `json:"limit"`
			Offset  int        `json:"offset"`
			Results []Delivery `json:"results"`
		}
		if err := c.do(ctx, call{method: "GET", path: "webhooks/", query: q}, &pg); err != nil {
			return nil, 0, 0, 0, err
		}
		for _, d := range pg.Results {
			if d.ID == "" || seen[d.ID] {
				continue
			}
			// Order is judged on new rows only: rows pushed back onto
			// this page by an insertion are newer than the last row of
			// the page before.
			if !last.IsZero() && d.CreatedAt.After(last) {
				ordered = false
			}
			if !d.CreatedAt.IsZero() {
				last = d.CreatedAt.Time
			}
			seen[d.ID] = true
			fresh++
			if f.Since.IsZero() || d.CreatedAt.IsZero() || !d.CreatedAt.Before(f.Since) {
				out = append(out, d)
			}
		}
		p.Pages++
		p.Count, p.Seen = pg.Count, len(seen)
		counts[pg.Count] = true
		return pg.Results, fresh, pg.Limit, pg.Count, nil
	}
	// pastSince reports whether the walk, newest first, has gone past
	// f.Since, so that every later row is older.
	pastSince := func() bool {
		return !f.Since.IsZero() && ordered && !last.IsZero() && last.Before(f.Since)
	}

	offset := 0
	for {
		rows, _, limit, count, err := page(offset)
		if err != nil {
			return out, err
		}
		if limit <= 0 {
			// A page object without its limit: fall back to what came.
			limit = len(rows)
		}
		offset += limit
		p.Offset = offset
		if progress != nil {
			progress(p)
		}
		if len(rows) == 0 || offset >= count || pastSince() {
			break
		}
		if p.Pages >= maxWalkPages {
			return out, fmt.Errorf("GET /webhooks/: still not at the end after %d pages; narrow the walk with --call-id", p.Pages)
		}
	}
	// Rows created during the walk sit at the head, newest first: when the
	// count moved, read the head again until a page brings nothing new.
	if ordered && len(counts) > 1 {
		for offset := 0; p.Pages < maxWalkPages; {
			rows, fresh, limit, count, err := page(offset)
			if err != nil {
				return out, err
			}
			if progress != nil {
				progress(p)
			}
			if limit <= 0 {
				limit = len(rows)
			}
			offset += limit
			if fresh == 0 || len(rows) == 0 || offset >= count {
				break
			}
		}
	}
	return out, nil
}

// Delivery reads one delivery with the exact payload that was sent.
func (c *Client) Delivery(ctx context.Context, id string) (*Delivery, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	var d Delivery
	if err := c.do(ctx, call{method: "GET", path: "webhooks/" + url.PathEscape(id) + "/", what: "delivery " + id}, &d); err != nil {
		return nil, err
	}
	d.Payload = exactPayload(d.Payload)
	return &d, nil
}

// exactPayload returns the bytes that were sent. The documentation gives
// payload as an object holding "the exact bytes sent", which is how it is
// served as is; a service that serves it as a JSON string of those bytes
// is read too. null means none.
func exactPayload(p json.RawMessage) json.RawMessage {
	t := bytes.TrimSpace(p)
	switch {
	case len(t) == 0 || string(t) == "null":
		return nil
	case t[0] == '"':
		var s string
		if json.Unmarshal(t, &s) == nil {
			return json.RawMessage(s)
		}
	}
	return p
}

// ReplayResult is the documentation's replay result (2.4).
type ReplayResult struct {
	ID     string `json:"id"`
	Status string `json:"status"`
	Queued bool   `json:"queued"`
}

// Replay asks the service to re-send a delivery: the same payload, with a
// fresh retry budget (4.3).
func (c *Client) Replay(ctx context.Context, id string) (*ReplayResult, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	var r ReplayResult
	body := map[string]string{"id": id}
	if err := c.do(ctx, call{method: "POST", path: "webhooks/replay/", body: body, what: "delivery " + id}, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// Media is what GET /call_logs/{id}/media/ answers; the documentation does
// not show its shape, so the fields are those of the media block (6.6) and
// Raw keeps the whole answer.
type Media struct {
	CallID        string          `json:"call_id"`
	RecordingURL  string          `json:"recording_url"`
	TranscriptURL string          `json:"transcript_url"`
	ExpiresIn     int             `json:"expires_in"`
	Raw           json.RawMessage `json:"-"`
}

// Media asks for the signed, short-lived links to a call's recording and
// transcript.
func (c *Client) Media(ctx context.Context, callID string) (*Media, error) {
	if err := checkID(callID); err != nil {
		return nil, err
	}
	var raw json.RawMessage
	if err := c.do(ctx, call{method: "GET", path: "call_logs/" + url.PathEscape(callID) + "/media/", what: "the media of call " + callID}, &raw); err != nil {
		return nil, err
	}
	m := &Media{Raw: raw}
	if err := json.Unmarshal(raw, m); err != nil {
		return nil, &Error{Op: "GET /call_logs/" + callID + "/media/", Message: "the response's data is not an object: " + err.Error()}
	}
	return m, nil
}

// checkID refuses ids that would change the request's path.
func checkID(id string) error {
	if id == "" || strings.ContainsAny(id, "/?#% \t\r\n") {
		return fmt.Errorf("id %q: want the UUID of a delivery or call", id)
	}
	return nil
}
