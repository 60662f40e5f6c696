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

	"github.com/calltap/calltap/inspector/voice/callevent"
)

// Timestamp is an ISO 8601 time from the API; the zero value is null.
type Timestamp = callevent.Timestamp

// Delivery is a webhook delivery record (documentation 2.3). Items of the
// delivery log carry the summary fields; GET /webhooks/{id}/ adds Payload,
// ResponseBody and the attempts listing.
type Delivery struct {
	callevent.DeliverySummary

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
	w := &logWalk{c: c, f: f, q: url.Values{}, seen: map[string]bool{}, ordered: true, counts: map[int]bool{}, progress: progress}
	if f.CallID != "" {
		w.q.Set("call_id", f.CallID)
	}
	w.q.Set("limit", strconv.Itoa(size))
	if err := w.walk(ctx); err != nil {
		return w.out, err
	}
	// Rows created during the walk sit at the head, newest first: when the
	// count moved, read the head again until a page brings nothing new.
	if w.ordered && len(w.counts) > 1 {
		if err := w.rereadHead(ctx); err != nil {
			return w.out, err
		}
	}
	return w.out, nil
}

// logWalk is one walk of the delivery log, owned by the Deliveries call
// that made it.
type logWalk struct {
	c        *Client
	f        Filter
	q        url.Values
	progress func(Progress)

	out     []Delivery
	seen    map[string]bool // ids read so far
	p       Progress
	ordered bool         // every new row so far came newest first
	last    time.Time    // the created_at of the last new row
	counts  map[int]bool // every count the pages gave
}

// logPage is what one page of the walk brought.
type logPage struct {
	rows         []Delivery
	fresh        int // rows not seen before
	limit, count int
}

// page reads the page at offset and keeps its new rows.
func (w *logWalk) page(ctx context.Context, offset int) (logPage, error) {
	w.q.Set("offset", strconv.Itoa(offset))
	var pg struct {
		Count   int        `json:"count"`
		Limit   int        `json:"limit"`
		Offset  int        `json:"offset"`
		Results []Delivery `json:"results"`
	}
	if err := w.c.do(ctx, call{method: "GET", path: "webhooks/", query: w.q}, &pg); err != nil {
		return logPage{}, err
	}
	fresh := 0
	for _, d := range pg.Results {
		if w.keep(d) {
			fresh++
		}
	}
	w.p.Pages++
	w.p.Count, w.p.Seen = pg.Count, len(w.seen)
	w.counts[pg.Count] = true
	limit := pg.Limit
	if limit <= 0 {
		// A page object without its limit: fall back to what came.
		limit = len(pg.Results)
	}
	return logPage{rows: pg.Results, fresh: fresh, limit: limit, count: pg.Count}, nil
}

// keep notes a row and reports whether it was new; new rows since f.Since
// join the result.
func (w *logWalk) keep(d Delivery) bool {
	if d.ID == "" || w.seen[d.ID] {
		return false
	}
	// Order is judged on new rows only: rows pushed back onto this page
	// by an insertion are newer than the last row of the page before.
	if !w.last.IsZero() && d.CreatedAt.After(w.last) {
		w.ordered = false
	}
	if !d.CreatedAt.IsZero() {
		w.last = d.CreatedAt.Time
	}
	w.seen[d.ID] = true
	if w.f.Since.IsZero() || d.CreatedAt.IsZero() || !d.CreatedAt.Before(w.f.Since) {
		w.out = append(w.out, d)
	}
	return true
}

// pastSince reports whether the walk, newest first, has gone past
// f.Since, so that every later row is older.
func (w *logWalk) pastSince() bool {
	return !w.f.Since.IsZero() && w.ordered && !w.last.IsZero() && w.last.Before(w.f.Since)
}

// walk reads the log from the start until the offset reaches the count.
func (w *logWalk) walk(ctx context.Context) error {
	offset := 0
	for {
		pg, err := w.page(ctx, offset)
		if err != nil {
			return err
		}
		offset += pg.limit
		w.p.Offset = offset
		w.report()
		if len(pg.rows) == 0 || offset >= pg.count || w.pastSince() {
			return nil
		}
		if w.p.Pages >= maxWalkPages {
			return fmt.Errorf("GET /webhooks/: still not at the end after %d pages; narrow the walk with --call-id", w.p.Pages)
		}
	}
}

func (w *logWalk) report() {
	if w.progress != nil {
		w.progress(w.p)
	}
}

// rereadHead reads the head of the log again until a page brings nothing
// new.
func (w *logWalk) rereadHead(ctx context.Context) error {
	for offset := 0; w.p.Pages < maxWalkPages; {
		pg, err := w.page(ctx, offset)
		if err != nil {
			return err
		}
		w.report()
		offset += pg.limit
		if pg.fresh == 0 || len(pg.rows) == 0 || offset >= pg.count {
			return nil
		}
	}
	return nil
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
