package callevent

import (
	"encoding/json"
	"sort"
	"time"
)

// CallEvent is one captured event of a call, as the store knows it.
type CallEvent struct {
	CaptureID  string
	Event      string
	DeliveryID string
	OccurredAt time.Time // zero when the payload's occurred_at does not parse
	ReceivedAt time.Time // when it reached us (the relay's arrival time for queued requests)
	Duplicate  bool      // a retry or replay of an earlier delivery
	Body       []byte
}

// Anomaly is something about a call's events that a developer should see.
type Anomaly struct {
	Code       string   `json:"code"`
	Message    string   `json:"message"`
	CaptureIDs []string `json:"capture_ids"`
}

// Anomaly codes.
const (
	AnomalyEndedAndFailed  = "ended_and_failed" // both call.ended and call.failed
	AnomalyMultipleEnded   = "multiple_ended"   // more than one call.ended delivery
	AnomalyMultipleFailed  = "multiple_failed"  // more than one call.failed delivery
	AnomalyAfterFinal      = "after_final"      // an event that cannot follow the final one did
	AnomalyOutOfOrder      = "out_of_order"     // arrived in another order than it occurred
	AnomalyAnalysisPending = "analysis_pending" // call.ended long ago, no call.analysis_completed
	AnomalyMissingEvents   = "missing_events"   // events the subscription implies never came
)

// AnomalyCodes lists every anomaly code.
var AnomalyCodes = []string{AnomalyEndedAndFailed, AnomalyMultipleEnded, AnomalyMultipleFailed, AnomalyAfterFinal, AnomalyOutOfOrder, AnomalyAnalysisPending, AnomalyMissingEvents}

// Call states of a summary.
const (
	StateInProgress = "in_progress" // no final event yet
	StateEnded      = "ended"
	StateFailed     = "failed"
)

// DefaultAnalysisPendingAfter is used when AnalyzeCall is given no time:
// analysis "may arrive minutes after call.ended" (documentation section 3).
const DefaultAnalysisPendingAfter = 15 * time.Minute

// CallSummary is what the events of one call say about it.
type CallSummary struct {
	CallID      string
	Events      []CallEvent // in the order they occurred, duplicates included
	Call        *Call       // the latest call block
	Analysis    *Analysis
	Media       *Media
	Final       string // KindEnded, KindFailed or ""
	State       string // StateInProgress, StateEnded or StateFailed
	OutcomeCode string
	FirstAt     time.Time // first received
	LastAt      time.Time // last received
	Anomalies   []Anomaly
}

// rank is the documented position of a kind within a call, used to order
// events whose occurred_at is equal.
func rank(kind string) int {
	switch kind {
	case KindStarted:
		return 0
	case KindConnected:
		return 1
	case KindEnded, KindFailed:
		return 2
	case KindRecordingAvailable:
		return 3
	case KindAnalysisCompleted:
		return 4
	}
	return 5
}

func (e CallEvent) at() time.Time {
	if !e.OccurredAt.IsZero() {
		return e.OccurredAt
	}
	return e.ReceivedAt
}

// AnalyzeCall orders the events of one call and looks for anomalies. now
// and analysisPendingAfter decide when a missing call.analysis_completed
// (or call.recording_available) becomes "pending"; a non-positive duration
// means DefaultAnalysisPendingAfter.
//
// The subscription of a call (event_webhook_events at dispatch) is not in
// its payloads, so calltap assumes the default: all six events.
func AnalyzeCall(events []CallEvent, now time.Time, analysisPendingAfter time.Duration) CallSummary {
	if analysisPendingAfter <= 0 {
		analysisPendingAfter = DefaultAnalysisPendingAfter
	}
	evs := sortByOccurrence(events)
	sum := CallSummary{Events: evs, State: StateInProgress}
	sum.FirstAt, sum.LastAt = receivedSpan(evs)
	v := newCallView(evs, now, analysisPendingAfter)
	v.describe(&sum)
	v.settle(&sum)
	sum.Anomalies = []Anomaly{}
	for _, check := range anomalyChecks {
		sum.Anomalies = append(sum.Anomalies, check(v)...)
	}
	return sum
}

// sortByOccurrence returns a copy of events in the order they occurred:
// by occurred_at (the arrival time when it does not parse), then by the
// documented position of their kind, then by arrival.
func sortByOccurrence(events []CallEvent) []CallEvent {
	evs := append([]CallEvent(nil), events...)
	sort.SliceStable(evs, func(i, j int) bool {
		a, b := evs[i], evs[j]
		if ta, tb := a.at(), b.at(); !ta.Equal(tb) {
			return ta.Before(tb)
		}
		if ra, rb := rank(a.Event), rank(b.Event); ra != rb {
			return ra < rb
		}
		return a.ReceivedAt.Before(b.ReceivedAt)
	})
	return evs
}

// receivedSpan returns when the first and the last of evs arrived,
// duplicates included.
func receivedSpan(evs []CallEvent) (first, last time.Time) {
	for _, e := range evs {
		if first.IsZero() || e.ReceivedAt.Before(first) {
			first = e.ReceivedAt
		}
		if e.ReceivedAt.After(last) {
			last = e.ReceivedAt
		}
	}
	return first, last
}

// callView is a call's events as the anomaly checks read them: the first
// copy of each delivery, in the order they occurred. It is built once by
// AnalyzeCall and only read afterwards.
type callView struct {
	uniq         []CallEvent      // first copy of each delivery, in order of occurrence
	payloads     []*Payload       // payloads[i] is uniq[i]'s body; nil when it does not decode
	byKind       map[string][]int // event kind → indexes into uniq
	final        int              // index into uniq of the final event; -1 while the call is in progress
	now          time.Time        // when the analysis is made
	pendingAfter time.Duration    // how long after call.ended a missing analysis is reported
}

// newCallView keeps the first copy of each delivery of evs (already in
// order of occurrence). Retries and replays repeat a delivery (section 6.9);
// the call's story is told by the first copy of each.
func newCallView(evs []CallEvent, now time.Time, pendingAfter time.Duration) *callView {
	v := &callView{byKind: map[string][]int{}, final: -1, now: now, pendingAfter: pendingAfter}
	seen := map[string]bool{}
	for _, e := range evs {
		if e.Duplicate || (e.DeliveryID != "" && seen[e.DeliveryID]) {
			continue
		}
		seen[e.DeliveryID] = true
		v.byKind[e.Event] = append(v.byKind[e.Event], len(v.uniq))
		v.uniq = append(v.uniq, e)
		v.payloads = append(v.payloads, decodePayload(e.Body))
	}
	// The final event is the first to occur of call.ended and call.failed.
	for i, e := range v.uniq {
		if e.Event == KindEnded || e.Event == KindFailed {
			v.final = i
			break
		}
	}
	return v
}

// decodePayload returns body's payload, or nil when it is not one.
func decodePayload(body []byte) *Payload {
	var p Payload
	if json.Unmarshal(body, &p) != nil {
		return nil
	}
	return &p
}

// describe fills sum from the payloads: the latest call, analysis and
// media blocks, and the call id of the first call block.
func (v *callView) describe(sum *CallSummary) {
	for _, p := range v.payloads {
		if p == nil {
			continue
		}
		if p.Call != nil {
			sum.Call = p.Call
			if sum.CallID == "" {
				sum.CallID = p.Call.CallID
			}
		}
		if p.Analysis != nil {
			sum.Analysis = p.Analysis
		}
		if p.Media != nil {
			sum.Media = p.Media
		}
	}
}

// settle sets the call's final event, state and outcome code. The outcome
// code of a failed call is the final event's; otherwise the latest call
// block's, if it has one.
func (v *callView) settle(sum *CallSummary) {
	if v.final >= 0 {
		sum.Final = v.uniq[v.final].Event
		sum.State = StateEnded
		if sum.Final == KindFailed {
			sum.State = StateFailed
			sum.OutcomeCode = outcomeCode(v.payloads[v.final])
		}
	}
	if sum.OutcomeCode == "" && sum.Call != nil && sum.Call.OutcomeCode != nil {
		sum.OutcomeCode = *sum.Call.OutcomeCode
	}
}

// outcomeCode returns p's call block's outcome_code, or "".
func outcomeCode(p *Payload) string {
	if p == nil || p.Call == nil || p.Call.OutcomeCode == nil {
		return ""
	}
	return *p.Call.OutcomeCode
}

// ids returns the capture ids of the events at idx in uniq.
func (v *callView) ids(idx ...[]int) []string {
	out := []string{}
	for _, list := range idx {
		for _, n := range list {
			out = append(out, v.uniq[n].CaptureID)
		}
	}
	return out
}

// endedOverdue reports since when the call has been ended (the first
// call.ended's arrival, or its occurred_at when the arrival is unknown), and
// whether that is longer ago than pendingAfter: by then the events that
// follow call.ended should have come.
func (v *callView) endedOverdue() (since time.Time, overdue bool) {
	ended := v.byKind[KindEnded]
	if len(ended) == 0 {
		return time.Time{}, false
	}
	e := v.uniq[ended[0]]
	since = e.ReceivedAt
	if since.IsZero() {
		since = e.OccurredAt
	}
	return since, !since.IsZero() && v.now.Sub(since) > v.pendingAfter
}

// HasAnomaly reports whether as has an anomaly with this code; "any"
// matches every anomaly.
func HasAnomaly(as []Anomaly, code string) bool {
	if code == "any" {
		return len(as) > 0
	}
	for _, a := range as {
		if a.Code == code {
			return true
		}
	}
	return false
}
