package callevent

import (
	"fmt"
	"strings"
	"time"
)

// anomalyChecks are run by AnalyzeCall in this order, one per anomaly code;
// the order is the order of a summary's anomalies.
var anomalyChecks = []func(*callView) []Anomaly{
	endedAndFailed,
	multipleEnded,
	multipleFailed,
	afterFinal,
	outOfOrder,
	analysisPending,
	missingEvents,
}

// newAnomaly builds an anomaly; captures is never nil, so that the JSON
// carries [] rather than null.
func newAnomaly(code string, captures []string, format string, args ...any) Anomaly {
	if captures == nil {
		captures = []string{}
	}
	return Anomaly{Code: code, Message: fmt.Sprintf(format, args...), CaptureIDs: captures}
}

// endedAndFailed finds AnomalyEndedAndFailed: the call has both a call.ended
// and a call.failed. The service ends a call with exactly one of them
// (documentation sections 3 and 6.2), so either the sender is wrong or two
// calls share a call_id; a handler that treats the two as exclusive will
// record the call twice, once as finished and once as failed.
func endedAndFailed(v *callView) []Anomaly {
	ended, failed := v.byKind[KindEnded], v.byKind[KindFailed]
	if len(ended) == 0 || len(failed) == 0 {
		return nil
	}
	return []Anomaly{newAnomaly(AnomalyEndedAndFailed, v.ids(ended, failed),
		"the call has both call.ended and call.failed; the service ends a call with exactly one of them")}
}

// multipleEnded finds AnomalyMultipleEnded: more than one delivery of
// call.ended with different ids. Retries and replays keep the delivery id
// (section 6.9) and are not counted, so these are separate sends of the
// end; a handler keyed on the delivery id alone processes the end twice.
func multipleEnded(v *callView) []Anomaly {
	return multiple(v, AnomalyMultipleEnded, KindEnded)
}

// multipleFailed finds AnomalyMultipleFailed: more than one delivery of
// call.failed with different ids; as multipleEnded, for a failed call.
func multipleFailed(v *callView) []Anomaly {
	return multiple(v, AnomalyMultipleFailed, KindFailed)
}

// multiple reports code when kind came in more than one delivery.
func multiple(v *callView, code, kind string) []Anomaly {
	idx := v.byKind[kind]
	if len(idx) <= 1 {
		return nil
	}
	return []Anomaly{newAnomaly(code, v.ids(idx),
		"%d different deliveries of %s (not retries: their ids differ)", len(idx), kind)}
}

// afterFinal finds AnomalyAfterFinal: an event occurred after the call's
// final event (the first of call.ended and call.failed) that cannot follow
// it. call.started and call.connected never follow the end; recording and
// analysis follow call.ended but not call.failed, since a call that never
// connected has nothing to record or analyse (section 3). A handler that
// closes the call at its final event will reopen it or fail.
func afterFinal(v *callView) []Anomaly {
	if v.final < 0 {
		return nil
	}
	f := v.uniq[v.final]
	var after []int
	for i := v.final + 1; i < len(v.uniq); i++ {
		if cannotFollow(f.Event, v.uniq[i].Event) {
			after = append(after, i)
		}
	}
	if len(after) == 0 {
		return nil
	}
	return []Anomaly{newAnomaly(AnomalyAfterFinal, v.ids(after), "%s occurred after the final %s", kindList(v.uniq, after), f.Event)}
}

// cannotFollow reports whether an event of kind may not occur after the
// final event final.
func cannotFollow(final, kind string) bool {
	switch kind {
	case KindStarted, KindConnected:
		return true
	case KindRecordingAvailable, KindAnalysisCompleted:
		return final == KindFailed
	}
	return false
}

// outOfOrder finds AnomalyOutOfOrder: events arrived in another order than
// they occurred. Retries (section 6.8: up to 32 minutes apart) and a tunnel
// that was down both cause it; a handler that assumes arrival order is the
// call's order will see, say, a call end before it connected. The analysis
// coming before call.ended is reported on its own, since the service allows
// it and a handler must expect it.
func outOfOrder(v *callView) []Anomaly {
	return append(analysisBeforeEnded(v), overtaken(v)...)
}

// analysisBeforeEnded reports call.analysis_completed that arrived or
// occurred before the first call.ended. The service allows it (the end's
// delivery may be retried), but a handler that expects the call to be closed
// first will trip over it.
func analysisBeforeEnded(v *callView) []Anomaly {
	ended, analyses := v.byKind[KindEnded], v.byKind[KindAnalysisCompleted]
	if len(ended) == 0 {
		return nil
	}
	e := v.uniq[ended[0]]
	var early []int
	for _, i := range analyses {
		if before(v.uniq[i], e) {
			early = append(early, i)
		}
	}
	if len(early) == 0 {
		return nil
	}
	return []Anomaly{newAnomaly(AnomalyOutOfOrder, append(v.ids(early), e.CaptureID),
		"call.analysis_completed came before call.ended (allowed by the service; handle the two in either order)")}
}

// before reports whether a arrived before b, or occurred before it when
// both times of occurrence are known.
func before(a, b CallEvent) bool {
	if a.ReceivedAt.Before(b.ReceivedAt) {
		return true
	}
	return !a.OccurredAt.IsZero() && !b.OccurredAt.IsZero() && a.OccurredAt.Before(b.OccurredAt)
}

// overtaken reports, for each event, the events that occurred later but
// arrived before it: a retry of a failed delivery, or a tunnel that was
// down. call.analysis_completed overtaking call.ended is left to
// analysisBeforeEnded.
func overtaken(v *callView) []Anomaly {
	var out []Anomaly
	for i, e := range v.uniq {
		if e.ReceivedAt.IsZero() {
			continue
		}
		var overtook []int
		for j := i + 1; j < len(v.uniq); j++ {
			if overtakes(v.uniq[j], e) {
				overtook = append(overtook, j)
			}
		}
		if len(overtook) > 0 {
			out = append(out, newAnomaly(AnomalyOutOfOrder, append([]string{e.CaptureID}, v.ids(overtook)...),
				"%s arrived after %s, which occurred later", displayKind(e.Event), kindList(v.uniq, overtook)))
		}
	}
	return out
}

// overtakes reports whether later, which occurred after e, arrived before
// it (and is not the analysis-before-end case reported on its own).
func overtakes(later, e CallEvent) bool {
	if later.ReceivedAt.IsZero() || !later.ReceivedAt.Before(e.ReceivedAt) {
		return false
	}
	return e.Event != KindEnded || later.Event != KindAnalysisCompleted
}

// analysisPending finds AnomalyAnalysisPending: call.ended came longer ago
// than the pending threshold and no call.analysis_completed has. Analysis
// "may arrive minutes after call.ended" (section 3), so a short wait is
// normal; a long one means it was lost, failed every retry (section 6.8),
// or came while the tunnel was down (section 6.10), and the developer
// should look at the delivery log or replay it (section 4.3).
func analysisPending(v *callView) []Anomaly {
	since, overdue := v.endedOverdue()
	if !overdue || len(v.byKind[KindAnalysisCompleted]) > 0 {
		return nil
	}
	return []Anomaly{newAnomaly(AnomalyAnalysisPending, v.ids(v.byKind[KindEnded][:1]),
		"call.ended %s ago and no call.analysis_completed yet (analysis may take minutes; shown after %s)",
		v.now.Sub(since).Round(time.Second), v.pendingAfter)}
}

// missingEvents finds AnomalyMissingEvents: events that the call's other
// events imply were sent never came. With event_webhook_events omitted at
// dispatch all six events are sent (section 6.1), and calltap assumes that
// subscription; a gap means a delivery failed for good or reached a tunnel
// that was down, and a handler waiting for it waits forever.
func missingEvents(v *callView) []Anomaly {
	var missing []string
	for _, kind := range expectedKinds(v) {
		if len(v.byKind[kind]) == 0 {
			missing = append(missing, kind)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	var at []string
	if v.final >= 0 {
		at = []string{v.uniq[v.final].CaptureID}
	}
	return []Anomaly{newAnomaly(AnomalyMissingEvents, at,
		"never received %s, which a call subscribed to all six events gets", strings.Join(missing, ", "))}
}

// expectedKinds lists the kinds the call's events imply were sent before
// them: an ended call started and connected (and, once overdue, has a
// recording); a failed call started; a recording or analysis implies the
// call started, connected and ended; a connection implies a start.
func expectedKinds(v *callView) []string {
	has := func(kind string) bool { return len(v.byKind[kind]) > 0 }
	switch {
	case has(KindEnded):
		if _, overdue := v.endedOverdue(); overdue {
			return []string{KindStarted, KindConnected, KindRecordingAvailable}
		}
		return []string{KindStarted, KindConnected}
	case has(KindFailed):
		return []string{KindStarted}
	case has(KindRecordingAvailable) || has(KindAnalysisCompleted):
		return []string{KindStarted, KindConnected, KindEnded}
	case has(KindConnected):
		return []string{KindStarted}
	}
	return nil
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
