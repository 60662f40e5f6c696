package emulator

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/google/uuid"

	"github.com/calltap/calltap/inspector/voice/callevent"
	"github.com/calltap/calltap/relay/api"
	"github.com/calltap/calltap/storage/servicedb"
)

// DeliveryItem is a row of GET /webhooks/ (whose fields the documentation
// does not show): the record of section 2.3 without the payload, the
// response body and the attempts listing.
type DeliveryItem struct {
	callevent.DeliverySummary
	NextAttemptAt *string `json:"next_attempt_at"` // the emulator's own: when the next attempt is due
}

// DeliveryRecord is the data of GET /webhooks/{id}/ (section 2.3).
type DeliveryRecord struct {
	DeliveryItem
	Payload      json.RawMessage `json:"payload"` // the exact bytes sent
	ResponseBody string          `json:"response_body"`
	AttemptLog   []AttemptItem   `json:"attempt_log"`
}

// AttemptItem is one entry of a record's attempt_log. The documentation
// names an attempts listing without giving its shape.
type AttemptItem struct {
	N              int     `json:"n"`       // 1, 2, ... over the delivery's life
	Replay         int     `json:"replay"`  // 0 for the original budget, k for the k-th replay's
	Attempt        int     `json:"attempt"` // 1..max_attempts within its budget
	At             *string `json:"at"`
	ResponseStatus *int    `json:"response_status"`
	Error          string  `json:"error"`
	DurationMS     float64 `json:"duration_ms"`
	ResponseBody   string  `json:"response_body"`
}

// ReplayResult is the data of POST /webhooks/replay/ (section 2.4).
type ReplayResult struct {
	ID     string `json:"id"`
	Status string `json:"status"`
	Queued bool   `json:"queued"`
}

func itemOf(d *servicedb.Delivery) DeliveryItem {
	it := DeliveryItem{DeliverySummary: callevent.DeliverySummary{
		ID: d.ID, Event: d.Event, URL: d.URL, Status: d.Status, Attempts: d.Attempts, MaxAttempts: d.MaxAttempts,
		Error: d.Error, CallID: d.CallID, CreatedAt: callevent.Timestamp{Time: d.CreatedAt}, DeliveredAt: callevent.Timestamp{Time: d.DeliveredAt},
	}}
	if d.ResponseStatus != 0 {
		rs := d.ResponseStatus
		it.ResponseStatus = &rs
	}
	if d.Status == StatusPending {
		it.NextAttemptAt = api.Time(d.NextAt)
	}
	return it
}

func (s *Server) listDeliveries(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit, offset, err := api.ParsePage(q)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	f := servicedb.DeliveryFilter{CallID: q.Get("call_id"), Event: q.Get("event"), Status: q.Get("status")}
	if f.CallID != "" {
		if _, err := uuid.Parse(f.CallID); err != nil {
			api.WriteError(w, api.Invalid("call_id must be a UUID; got %q", f.CallID))
			return
		}
	}
	if f.Event != "" && !callevent.IsKind(f.Event) {
		api.WriteError(w, api.Invalid("event %q is not an event kind", f.Event))
		return
	}
	switch f.Status {
	case "", StatusPending, StatusDelivered, StatusFailed:
	default:
		api.WriteError(w, api.Invalid("status must be %s, %s or %s", StatusPending, StatusDelivered, StatusFailed))
		return
	}
	rows, count, err := s.db.ListDeliveries(r.Context(), f, s.now(), servicedb.Page{Limit: limit, Offset: offset})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	items := make([]DeliveryItem, 0, len(rows))
	for _, d := range rows {
		items = append(items, itemOf(d))
	}
	api.WriteData(w, http.StatusOK, "", api.NewPage(count, limit, offset, items))
}

func (s *Server) getDelivery(w http.ResponseWriter, r *http.Request) {
	d, attempts, err := s.db.DeliveryByID(r.Context(), r.PathValue("id"), s.now())
	if errors.Is(err, servicedb.ErrNotFound) {
		api.WriteError(w, api.NotFound("delivery "+r.PathValue("id")))
		return
	} else if err != nil {
		s.fail(w, r, err)
		return
	}
	rec := DeliveryRecord{DeliveryItem: itemOf(d), Payload: d.Payload, ResponseBody: string(d.ResponseBody), AttemptLog: []AttemptItem{}}
	for _, a := range attempts {
		it := AttemptItem{N: a.N, Replay: a.Round, Attempt: a.Try, At: api.Time(a.At), Error: a.Error,
			DurationMS: float64(a.Duration.Microseconds()) / 1000, ResponseBody: string(a.ResponseBody)}
		if a.ResponseStatus != 0 {
			rs := a.ResponseStatus
			it.ResponseStatus = &rs
		}
		rec.AttemptLog = append(rec.AttemptLog, it)
	}
	api.WriteData(w, http.StatusOK, "", rec)
}

func (s *Server) replay(w http.ResponseWriter, r *http.Request) {
	var req struct {
		ID string `json:"id"`
	}
	if err := api.DecodeJSON(w, r, 4<<10, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	if req.ID == "" {
		api.WriteError(w, api.Invalid("id is required: the delivery to re-send"))
		return
	}
	d, err := s.db.ReplayDelivery(r.Context(), req.ID, s.now())
	if errors.Is(err, servicedb.ErrNotFound) {
		api.WriteError(w, api.NotFound("delivery "+req.ID))
		return
	} else if err != nil {
		s.fail(w, r, err)
		return
	}
	s.nudge()
	api.WriteData(w, http.StatusOK, "replay queued", ReplayResult{ID: d.ID, Status: d.Status, Queued: true})
}
