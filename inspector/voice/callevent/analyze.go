package callevent

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
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
	sum := CallSummary{Events: evs, State: StateInProgress}

	// Retries and replays repeat a delivery; the call's story is told by
	// the first copy of each.
	var uniq []CallEvent
	var payloads []*Payload
	seen := map[string]bool{}
	for _, e := range evs {
		if sum.FirstAt.IsZero() || e.ReceivedAt.Before(sum.FirstAt) {
			sum.FirstAt = e.ReceivedAt
		}
		if e.ReceivedAt.After(sum.LastAt) {
			sum.LastAt = e.ReceivedAt
		}
		if e.Duplicate || (e.DeliveryID != "" && seen[e.DeliveryID]) {
			continue
		}
		seen[e.DeliveryID] = true
		uniq = append(uniq, e)
		var p Payload
		if json.Unmarshal(e.Body, &p) != nil {
			payloads = append(payloads, nil)
			continue
		}
		payloads = append(payloads, &p)
	}

	byKind := map[string][]int{} // kind → indexes into uniq
	for i, e := range uniq {
		byKind[e.Event] = append(byKind[e.Event], i)
		p := payloads[i]
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
	ids := func(idx []int) []string {
		out := make([]string, len(idx))
		for i, n := range idx {
			out[i] = uniq[n].CaptureID
		}
		return out
	}
	add := func(code string, captures []string, format string, args ...any) {
		if captures == nil {
			captures = []string{}
		}
		sum.Anomalies = append(sum.Anomalies, Anomaly{Code: code, Message: fmt.Sprintf(format, args...), CaptureIDs: captures})
	}

	ended, failed := byKind[KindEnded], byKind[KindFailed]
	if len(ended) > 0 && len(failed) > 0 {
		add(AnomalyEndedAndFailed, ids(append(append([]int(nil), ended...), failed...)),
			"the call has both call.ended and call.failed; the service ends a call with exactly one of them")
	}
	if len(ended) > 1 {
		add(AnomalyMultipleEnded, ids(ended), "%d different deliveries of call.ended (not retries: their ids differ)", len(ended))
	}
	if len(failed) > 1 {
		add(AnomalyMultipleFailed, ids(failed), "%d different deliveries of call.failed (not retries: their ids differ)", len(failed))
	}

	// The final event is the first to occur of call.ended and call.failed.
	final := -1
	for i, e := range uniq {
		if e.Event == KindEnded || e.Event == KindFailed {
			final = i
			break
		}
	}
	if final >= 0 {
		f := uniq[final]
		sum.Final = f.Event
		sum.State = StateEnded
		if f.Event == KindFailed {
			sum.State = StateFailed
			if p := payloads[final]; p != nil && p.Call != nil && p.Call.OutcomeCode != nil {
				sum.OutcomeCode = *p.Call.OutcomeCode
			}
		}
		var after []int
		for i := final + 1; i < len(uniq); i++ {
			switch uniq[i].Event {
			case KindStarted, KindConnected:
				after = append(after, i)
			case KindRecordingAvailable, KindAnalysisCompleted:
				// They follow call.ended, but a call that never
				// connected has nothing to record or analyse.
				if f.Event == KindFailed {
					after = append(after, i)
				}
			}
		}
		if len(after) > 0 {
			add(AnomalyAfterFinal, ids(after), "%s occurred after the final %s", kindList(uniq, after), f.Event)
		}
	}
	if sum.OutcomeCode == "" && sum.Call != nil && sum.Call.OutcomeCode != nil {
		sum.OutcomeCode = *sum.Call.OutcomeCode
	}

	// Analysis before the end of the call: the service allows it (the
	// end's delivery may be retried), but a handler that expects the call
	// to be closed first will trip over it.
	analyses := byKind[KindAnalysisCompleted]
	if len(ended) > 0 && len(analyses) > 0 {
		e := uniq[ended[0]]
		var early []int
		for _, i := range analyses {
			a := uniq[i]
			if a.ReceivedAt.Before(e.ReceivedAt) || (!a.OccurredAt.IsZero() && !e.OccurredAt.IsZero() && a.OccurredAt.Before(e.OccurredAt)) {
				early = append(early, i)
			}
		}
		if len(early) > 0 {
			add(AnomalyOutOfOrder, append(ids(early), e.CaptureID),
				"call.analysis_completed came before call.ended (allowed by the service; handle the two in either order)")
		}
	}
	// Any other event that arrived after one that occurred later: a retry
	// of a failed delivery, or a tunnel that was down.
	for i, e := range uniq {
		if e.ReceivedAt.IsZero() {
			continue
		}
		var overtook []int
		for j := i + 1; j < len(uniq); j++ {
			l := uniq[j]
			if l.ReceivedAt.IsZero() || !l.ReceivedAt.Before(e.ReceivedAt) {
				continue
			}
			if e.Event == KindEnded && l.Event == KindAnalysisCompleted {
				continue // reported above
			}
			overtook = append(overtook, j)
		}
		if len(overtook) > 0 {
			add(AnomalyOutOfOrder, append([]string{e.CaptureID}, ids(overtook)...),
				"%s arrived after %s, which occurred later", displayKind(e.Event), kindList(uniq, overtook))
		}
	}

	pendingSince := func(idx int) time.Time {
		e := uniq[idx]
		if !e.ReceivedAt.IsZero() {
			return e.ReceivedAt
		}
		return e.OccurredAt
	}
	overdue := false
	if len(ended) > 0 {
		since := pendingSince(ended[0])
		overdue = !since.IsZero() && now.Sub(since) > analysisPendingAfter
		if overdue && len(analyses) == 0 {
			add(AnomalyAnalysisPending, ids(ended[:1]),
				"call.ended %s ago and no call.analysis_completed yet (analysis may take minutes; shown after %s)",
				now.Sub(since).Round(time.Second), analysisPendingAfter)
		}
	}

	var missing []string
	want := func(kind string) {
		if len(byKind[kind]) == 0 {
			missing = append(missing, kind)
		}
	}
	switch {
	case len(ended) > 0:
		want(KindStarted)
		want(KindConnected)
		if overdue {
			want(KindRecordingAvailable)
		}
	case len(failed) > 0:
		want(KindStarted)
	case len(byKind[KindConnected]) > 0 || len(byKind[KindRecordingAvailable]) > 0 || len(analyses) > 0:
		want(KindStarted)
		if len(byKind[KindRecordingAvailable]) > 0 || len(analyses) > 0 {
			want(KindConnected)
			want(KindEnded)
		}
	}
	if len(missing) > 0 {
		var at []string
		if final >= 0 {
			at = []string{uniq[final].CaptureID}
		}
		add(AnomalyMissingEvents, at, "never received %s, which a call subscribed to all six events gets", strings.Join(missing, ", "))
	}
	if sum.Anomalies == nil {
		sum.Anomalies = []Anomaly{}
	}
	return sum
}

// HasAnomaly reports whether the summary has an anomaly with this code.
func (s CallSummary) HasAnomaly(code string) bool {
	for _, a := range s.Anomalies {
		if a.Code == code {
			return true
		}
	}
	return false
}

func displayKind(k string) string {
	if k == "" {
		return "an event without a kind"
	}
	return k
}

func kindList(evs []CallEvent, idx []int) string {
	names := make([]string, len(idx))
	for i, n := range idx {
		names[i] = displayKind(evs[n].Event)
	}
	return strings.Join(names, ", ")
}
