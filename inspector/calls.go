package inspector

import (
	"context"
	"net/http"
	"time"

	"github.com/calltap/calltap/inspector/voice/callevent"
	"github.com/calltap/calltap/relay/api"
	"github.com/calltap/calltap/storage"
	"github.com/calltap/calltap/storage/agentdb"
)

// The calls API groups captures by call_id and tells each call's story:
//
//	GET /api/v1/ext/calls/?limit&offset&event&outcome_code&anomaly=<code>|any
//	GET /api/v1/ext/calls/{call_id}/
//
// Filters by anomaly are applied after analysis, which needs every event
// of every candidate call; that is fine at the scale of one developer's
// captures and keeps the rules in one place (callevent.AnalyzeCall).

// CallListItem is a call in a listing.
type CallListItem struct {
	CallID      string              `json:"call_id"`
	State       string              `json:"state"`       // in_progress | ended | failed
	FinalEvent  string              `json:"final_event"` // call.ended | call.failed | ""
	OutcomeCode string              `json:"outcome_code"`
	EventCount  int                 `json:"event_count"` // captures, duplicates included
	Kinds       []string            `json:"kinds"`       // event kinds in the order they occurred, without repeats
	LastEvent   string              `json:"last_event"`  // kind of the last event to occur
	FirstAt     *string             `json:"first_at"`    // first capture received
	LastAt      *string             `json:"last_at"`     // last capture received
	Direction   string              `json:"direction"`
	FromNumber  string              `json:"from_number"`
	ToNumber    string              `json:"to_number"`
	ContactName string              `json:"contact_name"`
	Disposition *string             `json:"disposition"`
	LeadScore   *float64            `json:"lead_score"`
	Anomalies   []callevent.Anomaly `json:"anomalies"`
}

// CallTimelineEvent is one capture in a call's timeline.
type CallTimelineEvent struct {
	CaptureID      string  `json:"capture_id"`
	Event          string  `json:"event"`
	DeliveryID     string  `json:"delivery_id"`
	OccurredAt     string  `json:"occurred_at"` // as sent
	ReceivedAt     *string `json:"received_at"` // at the relay for queued requests, else at the agent
	Duplicate      bool    `json:"duplicate"`
	DuplicateOf    string  `json:"duplicate_of"`
	ReplayOf       string  `json:"replay_of"`
	Source         string  `json:"source"`
	Queued         bool    `json:"queued"`
	Status         string  `json:"status"`
	ResponseStatus *int    `json:"response_status"`
	CheckErrors    int     `json:"check_errors"`   // contract findings of severity error
	CheckWarnings  int     `json:"check_warnings"` // and warning
}

// CallDetail is one call in full.
type CallDetail struct {
	CallListItem
	Events   []CallTimelineEvent `json:"events"`
	Call     *callevent.Call     `json:"call"` // the latest call block
	Analysis *callevent.Analysis `json:"analysis"`
	Media    *callevent.Media    `json:"media"`
	// MediaFiles are the saved copies of the call's recording and
	// transcript (see mediasave.Saver).
	MediaFiles []MediaFileJSON `json:"media_files"`
}

// CallsAPI serves the calls endpoints from the agent's store.
type CallsAPI struct {
	DB *agentdb.AgentStore
	// PendingAfter is how long after call.ended a missing
	// call.analysis_completed is reported; zero means
	// callevent.DefaultAnalysisPendingAfter.
	PendingAfter time.Duration
}

// CallRoutes registers the calls endpoints on mux.
func CallRoutes(mux *http.ServeMux, db *agentdb.AgentStore, pendingAfter time.Duration) {
	c := &CallsAPI{DB: db, PendingAfter: pendingAfter}
	mux.HandleFunc("GET /api/v1/ext/calls/{$}", c.List)
	mux.HandleFunc("GET /api/v1/ext/calls/{call_id}/{$}", c.Get)
}

// CallEvents turns a call's captures into the events callevent analyses.
func CallEvents(caps []*agentdb.Capture) []callevent.CallEvent {
	out := make([]callevent.CallEvent, 0, len(caps))
	for _, c := range caps {
		e := callevent.CallEvent{CaptureID: c.ID, Event: c.Event, DeliveryID: c.DeliveryID, ReceivedAt: c.CreatedAt,
			Duplicate: c.DuplicateOf != "", Body: c.Body}
		if !c.ArrivedAt.IsZero() {
			e.ReceivedAt = c.ArrivedAt
		}
		if t, err := callevent.ParseTime(c.OccurredAt); err == nil || err == callevent.ErrNoOffset {
			e.OccurredAt = t
		}
		out = append(out, e)
	}
	return out
}

func (c *CallsAPI) analyze(caps []*agentdb.Capture) callevent.CallSummary {
	return callevent.AnalyzeCall(CallEvents(caps), time.Now(), c.PendingAfter)
}

func callListItem(callID string, caps []*agentdb.Capture, s callevent.CallSummary) CallListItem {
	it := CallListItem{CallID: callID, State: s.State, FinalEvent: s.Final, OutcomeCode: s.OutcomeCode, EventCount: len(caps),
		Kinds: []string{}, FirstAt: api.Time(s.FirstAt), LastAt: api.Time(s.LastAt), Anomalies: s.Anomalies}
	seen := map[string]bool{}
	for _, e := range s.Events {
		if e.Event != "" && !seen[e.Event] {
			seen[e.Event] = true
			it.Kinds = append(it.Kinds, e.Event)
		}
	}
	if n := len(s.Events); n > 0 {
		it.LastEvent = s.Events[n-1].Event
	}
	if call := s.Call; call != nil {
		it.Direction, it.FromNumber, it.ToNumber, it.Disposition = call.Direction, call.FromNumber, call.ToNumber, call.Disposition
		if call.Contact != nil {
			it.ContactName = call.Contact.Name
		}
	}
	if s.Analysis != nil {
		it.LeadScore = s.Analysis.LeadScore
		if it.Disposition == nil && s.Analysis.Disposition != "" {
			d := s.Analysis.Disposition
			it.Disposition = &d
		}
	}
	return it
}

// List serves GET /api/v1/ext/calls/.
func (c *CallsAPI) List(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit, offset, err := api.ParsePage(q)
	if err != nil {
		api.WriteError(w, err)
		return
	}
	anomaly := q.Get("anomaly")
	if anomaly != "" && anomaly != "any" && !callsIsAnomaly(anomaly) {
		api.WriteError(w, api.Invalid("anomaly must be any or one of %v, got %q", callevent.AnomalyCodes, anomaly))
		return
	}
	f := agentdb.CallFilter{Event: q.Get("event"), OutcomeCode: q.Get("outcome_code"), Page: storage.Page{Limit: limit, Offset: offset}}
	f.All = anomaly != ""
	ctx := r.Context()
	rows, count, err := c.DB.Calls(ctx, f)
	if err != nil {
		api.WriteError(w, err)
		return
	}
	items, err := c.items(ctx, rows)
	if err != nil {
		api.WriteError(w, err)
		return
	}
	if anomaly != "" {
		kept := items[:0]
		for _, it := range items {
			if callevent.HasAnomaly(it.Anomalies, anomaly) {
				kept = append(kept, it)
			}
		}
		count = len(kept)
		items = kept[min(offset, len(kept)):min(offset+limit, len(kept))]
	}
	api.WriteData(w, http.StatusOK, "", api.NewPage(count, limit, offset, items))
}

func (c *CallsAPI) items(ctx context.Context, rows []agentdb.CallRow) ([]CallListItem, error) {
	ids := make([]string, len(rows))
	for i, r := range rows {
		ids[i] = r.CallID
	}
	caps, err := c.DB.CallCaptures(ctx, ids...)
	if err != nil {
		return nil, err
	}
	out := make([]CallListItem, 0, len(rows))
	for _, r := range rows {
		cs := caps[r.CallID]
		out = append(out, callListItem(r.CallID, cs, c.analyze(cs)))
	}
	return out, nil
}

func callsIsAnomaly(code string) bool {
	for _, c := range callevent.AnomalyCodes {
		if c == code {
			return true
		}
	}
	return false
}

// Get serves GET /api/v1/ext/calls/{call_id}/.
func (c *CallsAPI) Get(w http.ResponseWriter, r *http.Request) {
	d, err := c.Detail(r.Context(), r.PathValue("call_id"))
	if err != nil {
		api.WriteError(w, err)
		return
	}
	api.WriteData(w, http.StatusOK, "", d)
}

// Detail builds the detail of one call; an unknown call is a 404 *api.Error.
func (c *CallsAPI) Detail(ctx context.Context, callID string) (*CallDetail, error) {
	all, err := c.DB.CallCaptures(ctx, callID)
	if err != nil {
		return nil, err
	}
	caps := all[callID]
	if len(caps) == 0 {
		return nil, api.NotFound("call")
	}
	s := c.analyze(caps)
	d := &CallDetail{CallListItem: callListItem(callID, caps, s), Call: s.Call, Analysis: s.Analysis, Media: s.Media,
		Events: make([]CallTimelineEvent, 0, len(caps)), MediaFiles: []MediaFileJSON{}}
	byID := make(map[string]*agentdb.Capture, len(caps))
	for _, cp := range caps {
		byID[cp.ID] = cp
	}
	for _, e := range s.Events {
		cp := byID[e.CaptureID]
		te := CallTimelineEvent{CaptureID: cp.ID, Event: cp.Event, DeliveryID: cp.DeliveryID, OccurredAt: cp.OccurredAt,
			ReceivedAt: api.Time(e.ReceivedAt), Duplicate: e.Duplicate, DuplicateOf: cp.DuplicateOf, ReplayOf: cp.ReplayOf,
			Source: cp.Source, Queued: cp.Queued, Status: cp.Status}
		if cp.ResponseStatus > 0 {
			st := cp.ResponseStatus
			te.ResponseStatus = &st
		}
		for _, f := range callevent.CheckReceived(cp.Body, e.ReceivedAt) {
			switch f.Severity {
			case callevent.SevError:
				te.CheckErrors++
			case callevent.SevWarning:
				te.CheckWarnings++
			}
		}
		d.Events = append(d.Events, te)
	}
	files, _, err := c.DB.MediaFiles(ctx, agentdb.MediaFilter{CallID: callID})
	if err != nil {
		return nil, err
	}
	for _, f := range files {
		d.MediaFiles = append(d.MediaFiles, MediaFileOf(f))
	}
	return d, nil
}
