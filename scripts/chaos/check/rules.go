package check

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/calltap/calltap/relay/api"
	"github.com/calltap/calltap/scripts/chaos/history"
)

// rules are the safety rules, each a function of the indexed history. The
// order is the report's.
var rules = []func(*index) []Violation{
	ruleLost2xx,
	ruleNotInStore,
	ruleInvented2xx,
	ruleUndocumentedRefusal,
	ruleDeliveredAfterRefusal,
	ruleRefusedAfterDelivery,
	ruleStoreOutcome,
	ruleStoreStatus,
	ruleOrder,
	ruleExtraCopy,
	ruleDuplicateMarked,
	ruleNothingPending,
	ruleRoute,
	ruleClaim,
	ruleClaimStore,
}

// ruleDocs says each rule in a sentence, for the report's readers; the
// rule's function comment says it exactly.
var ruleDocs = []struct{ Kind, Rule, Says string }{
	{KindLoss, "Lost2xx", "every request answered 2xx (or 202) reached the handler"},
	{KindLoss, "NotInStore", "every request answered 2xx (or 202) is in the agent's store"},
	{KindInvented, "Invented2xx", "every 2xx is the handler's status and body for a copy it had received, or the relay's queued 202"},
	{KindInvented, "UndocumentedRefusal", "every other answer is the handler's, a documented 4xx, or a 5xx with Retry-After"},
	{KindInvented, "DeliveredAfterRefusal", "a copy at the handler follows an attempt not already refused"},
	{KindInvented, "RefusedAfterDelivery", "an attempt refused while its copy reached the handler needs a fault of the path"},
	{KindStore, "StoreOutcome", "the capture of an attempt answered 2xx says delivered with that status, or outcome unknown"},
	{KindStore, "StoreStatus", "a capture that says delivered holds a status the handler gave"},
	{KindOrder, "Order", "of two requests of a tunnel at one handler (an agent's, a route's), the one accepted before the other was sent reaches it first"},
	{KindOnce, "ExtraCopy", "each copy after the first has a re-send of its own or a crash since the first"},
	{KindOnce, "DuplicateMarked", "each capture after the first of a delivery is marked duplicate_of the first"},
	{KindOnce, "NothingPending", "nothing is pending or queued once the run drained"},
	{KindRoute, "Route", "each request at the default agent reached the handler of the route its event kind and its call's developer give, and no other"},
	{KindClaim, "Claim", "each request reached the agent of its call's claimant (the developer its first event names), or the default agent when nobody claims it, and no other"},
	{KindClaim, "ClaimStore", "each agent's store holds only the calls of its own seat"},
}

// ruleLost2xx — no loss, handler half: every delivery a sender was answered
// 2xx for (any attempt; a 202 for a queued request included) reached the
// handler at least once by the time the run drained.
func ruleLost2xx(ix *index) []Violation {
	var out []Violation
	for _, d := range ix.order {
		a := ix.accepted(d)
		if a < 0 || len(ix.copies[d]) > 0 {
			continue
		}
		s := ix.h.Sends[a]
		out = append(out, ix.violation(KindLoss, "Lost2xx", d, s.AnsweredAt,
			"answered %d at %s (attempt %d) but never reached the handler", s.Status, ix.rel(s.AnsweredAt), s.Attempt))
	}
	return out
}

// ruleNotInStore — no loss, store half: every delivery a sender was answered
// 2xx for (202 included) has at least one capture in the store read after
// the drain. A 2xx means the request is on disk.
func ruleNotInStore(ix *index) []Violation {
	var out []Violation
	for _, d := range ix.order {
		a := ix.accepted(d)
		if a < 0 || len(ix.captures[d]) > 0 {
			continue
		}
		s := ix.h.Sends[a]
		out = append(out, ix.violation(KindLoss, "NotInStore", d, s.AnsweredAt,
			"answered %d at %s (attempt %d) but not in the agent's store", s.Status, ix.rel(s.AnsweredAt), s.Attempt))
	}
	return out
}

// ruleInvented2xx — no invented answer, 2xx half: every 2xx a sender got is
// either the status and body the handler answered to a copy of that same
// delivery that it had received by then, or a 202 whose body is the
// relay's envelope with data.queued true (the request is kept and
// delivered later; ruleLost2xx checks that it was).
func ruleInvented2xx(ix *index) []Violation {
	var out []Violation
	for i, s := range ix.h.Sends {
		if ci, ok := ix.answered[i]; !ok || ci >= 0 || queuedAnswer(s) {
			continue
		}
		out = append(out, ix.violation(KindInvented, "Invented2xx", s.DeliveryID, s.AnsweredAt,
			"attempt %d answered %d at %s with a body no handler copy of the delivery gave: %.80q",
			s.Attempt, s.Status, ix.rel(s.AnsweredAt), s.Body))
	}
	return out
}

// documented4xx are the refusals the README ("Limits", "Running a relay")
// documents for a webhook sender, each with the error codes of relay/api
// its envelope may carry: a bad path (400), a missing or wrong required
// header or token (401), an unknown tunnel (404), a body too slow (408) or
// too large (413), a rate limit (429, which must carry Retry-After).
var documented4xx = map[int][]string{
	400: {api.CodeInvalid},
	401: {api.CodeUnauthorized, api.CodeHeaderRejected},
	404: {api.CodeNotFound},
	408: {api.CodeRequestTimeout},
	413: {api.CodeTooLarge},
	429: {api.CodeRateLimited},
}

// ruleUndocumentedRefusal — no invented answer, refusal half: every answer
// that is not a 2xx (no answer at all, status 0, is not one) is the
// handler's own answer to a copy of the delivery, or a documented 4xx (its
// status in documented4xx and its body the error envelope with one of that
// status's codes; a 429 with Retry-After), or a 5xx with Retry-After, so
// that the sender knows to retry (a 503 outcome_unknown too: it counts as
// no answer elsewhere only with Retry-After, see unknownAnswer). Anything
// else (a 3xx, a bare 502, a 403) is an answer calltap made up.
func ruleUndocumentedRefusal(ix *index) []Violation {
	var out []Violation
	for i, s := range ix.h.Sends {
		if !refused(s) || ix.handlerAnswer(i) || documentedRefusal(s) {
			continue
		}
		out = append(out, ix.violation(KindInvented, "UndocumentedRefusal", s.DeliveryID, s.AnsweredAt,
			"attempt %d answered %d at %s (Retry-After %q), neither the handler's answer nor a documented refusal: %.80q",
			s.Attempt, s.Status, ix.rel(s.AnsweredAt), s.RetryAfter, s.Body))
	}
	return out
}

func documentedRefusal(s history.Send) bool {
	if s.Status >= 500 && s.Status < 600 {
		return s.RetryAfter != ""
	}
	codes, ok := documented4xx[s.Status]
	if !ok || (s.Status == 429 && s.RetryAfter == "") {
		return false
	}
	var env struct {
		Status *bool `json:"status"`
		Error  *struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal([]byte(s.Body), &env) != nil || env.Status == nil || *env.Status || env.Error == nil {
		return false
	}
	return slices.Contains(codes, env.Error.Code)
}

// ruleDeliveredAfterRefusal — no invented answer: a request answered
// non-2xx reaches the handler only through a later attempt. Each handler
// copy must follow a send of its delivery, sent before the copy arrived,
// that was answered 2xx, or got no answer (status 0: the sender could not
// tell) or a 503 outcome_unknown with Retry-After (which says as much:
// unknownAnswer), or was still waiting for its answer when the copy arrived; a
// queued 202 counts only for a copy whose capture was queued too (see
// notRefusedBefore). A copy whose earlier sends were all refused before it
// arrived was delivered after its sender was told it was not (a 503
// delivered 20 s later; a request a relay refused while its frame was still
// on the way to the agent); a copy with no earlier send came from nowhere.
func ruleDeliveredAfterRefusal(ix *index) []Violation {
	var out []Violation
	for d, cs := range ix.copies {
		for _, ci := range cs {
			if ix.explained(d, ci) {
				continue
			}
			c := ix.h.Handler[ci]
			out = append(out, ix.violation(KindInvented, "DeliveredAfterRefusal", d, c.ReceivedAt,
				"reached the handler at %s, but %s", ix.rel(c.ReceivedAt), ix.sendsBefore(d, ci)))
		}
	}
	return out
}

// explained reports whether copy ci of d follows a send of d that may be
// how it came.
func (ix *index) explained(d string, ci int) bool {
	for _, i := range ix.sends[d] {
		if ix.notRefusedBefore(i, ci) {
			return true
		}
	}
	return false
}

// sendsBefore describes the sends of d made before copy ci, for a message:
// "its attempts before were refused or queued: #1 503 at t+47.839s, #2 202
// at t+48.343s (the copy came live, not from the queue)".
func (ix *index) sendsBefore(d string, ci int) string {
	list, n, queued := ix.attempts(d, ix.h.Handler[ci].ReceivedAt)
	switch {
	case n == 0:
		return "no sender had sent it yet"
	case queued:
		return "its attempts before were refused or queued: " + list + " (the copy came live, not from the queue)"
	}
	return "its attempts before were refused before it came: " + list
}

// attempts lists the sends of d made by t, "#1 503 at t+1.000s, #2 200 at
// t+2.000s", at most four; and how many, and whether one was a queued 202.
func (ix *index) attempts(d string, t int64) (list string, n int, queued bool) {
	var b strings.Builder
	for _, i := range ix.sends[d] {
		s := ix.h.Sends[i]
		if s.SentAt > t {
			continue
		}
		if n++; n <= 4 {
			if n > 1 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "#%d %d at %s", s.Attempt, s.Status, ix.rel(s.AnsweredAt))
		}
		queued = queued || queuedAnswer(s)
	}
	if n > 4 {
		fmt.Fprintf(&b, " and %d more", n-4)
	}
	return b.String(), n, queued
}

// ruleRefusedAfterDelivery — no invented answer: an attempt answered
// non-2xx (other than by the handler itself) must not have reached the
// handler, unless a fault of the path made that unknowable or the answer
// says so (a 503 outcome_unknown with Retry-After, unknownAnswer: the
// sender was not told it failed, as with no answer). The rule: if a
// copy of the delivery arrived while the attempt waited for its answer
// (sent_at <= received_at <= answered_at), no other send of the delivery
// could have caused that copy (see couldCause), and no fault other than a
// full disk was under way during the wait (see overlaps: a killed, stopped
// or cut agent, relay or NATS server can lose an answer the handler gave),
// the handler processed the request and the sender was told it failed:
// e.g. a 502 after the handler processed it on a full disk.
func ruleRefusedAfterDelivery(ix *index) []Violation {
	var out []Violation
	for _, d := range ix.order {
		for _, i := range ix.sends[d] {
			s := ix.h.Sends[i]
			if !toldFailed(s) || ix.handlerAnswer(i) || overlaps(ix.paths, s.SentAt, s.AnsweredAt) {
				continue
			}
			if ci := ix.soleCopy(d, i); ci >= 0 {
				out = append(out, ix.violation(KindInvented, "RefusedAfterDelivery", d, s.AnsweredAt,
					"attempt %d answered %d at %s, but the handler had received it at %s, with no fault under way",
					s.Attempt, s.Status, ix.rel(s.AnsweredAt), ix.rel(ix.h.Handler[ci].ReceivedAt)))
			}
		}
	}
	return out
}

// soleCopy finds a copy of d that arrived while send i waited and that no
// other send of d could have caused; -1 if none.
func (ix *index) soleCopy(d string, i int) int {
	s := ix.h.Sends[i]
	for _, ci := range ix.copies[d] {
		c := ix.h.Handler[ci]
		if c.ReceivedAt < s.SentAt || c.ReceivedAt > s.AnsweredAt+stampSlack {
			continue
		}
		other := false
		for _, j := range ix.sends[d] {
			if j != i && ix.couldCause(j, ci) {
				other = true
				break
			}
		}
		if !other {
			return ci
		}
	}
	return -1
}

// captureSkew allows for the agent and the chaos program stamping times
// from two processes of one machine.
const captureSkew = int64(time.Second)

// unknownStates are the store's words for "the outcome is not known": the
// agent was stopped or killed while the handler had the request.
var unknownStates = []string{"interrupted", "answer-unknown", "unknown"}

// outcomeUnknown reports whether capture c says plainly that its outcome
// is not known: one of unknownStates, or failed with the agent's
// "interrupted" reason.
func outcomeUnknown(c history.Capture) bool {
	return slices.Contains(unknownStates, c.State) || (c.State == "failed" && strings.HasPrefix(c.Error, "interrupted"))
}

// ruleStoreOutcome — the store agrees: for each attempt answered 2xx with
// the handler's answer (a queued 202 tells the sender nothing about the
// handler), the capture that attempt saved — the delivery's latest capture
// received by the answer, give or take captureSkew — says delivered with
// the same status, or says the outcome is unknown (unknownStates). A
// capture marked failed whose sender got 200 breaks it.
func ruleStoreOutcome(ix *index) []Violation {
	var out []Violation
	for _, d := range ix.order {
		for _, i := range ix.sends[d] {
			if ci, ok := ix.answered[i]; !ok || ci < 0 {
				continue // not a 2xx, or not the handler's (a queued 202)
			}
			s := ix.h.Sends[i]
			p := ix.captureFor(d, s.AnsweredAt, captureSkew)
			if p < 0 {
				continue // ruleNotInStore reports a delivery with none
			}
			c := ix.h.Store[p]
			if (c.State == "delivered" && c.ResponseStatus == s.Status) || outcomeUnknown(c) {
				continue
			}
			out = append(out, ix.violation(KindStore, "StoreOutcome", d, s.AnsweredAt,
				"the sender was told %d at %s; the store's capture %s says %s (status %d)",
				s.Status, ix.rel(s.AnsweredAt), c.CaptureID, c.State, c.ResponseStatus))
		}
	}
	return out
}

// ruleStoreStatus — the store agrees: a capture that says delivered holds a
// status the handler really answered to a copy of its delivery.
func ruleStoreStatus(ix *index) []Violation {
	var out []Violation
	for _, c := range ix.h.Store {
		if c.State != "delivered" || ix.handlerGave(c.DeliveryID, c.ResponseStatus) {
			continue
		}
		out = append(out, ix.violation(KindStore, "StoreStatus", c.DeliveryID, c.ReceivedAt,
			"the store's capture %s says delivered with status %d, which the handler never answered to this delivery",
			c.CaptureID, c.ResponseStatus))
	}
	return out
}

func (ix *index) handlerGave(d string, status int) bool {
	for _, ci := range ix.copies[d] {
		if ix.h.Handler[ci].Status == status {
			return true
		}
	}
	return false
}

// accept is a delivery's place in the order rule.
type accept struct {
	d        string
	at       int64 // its first 2xx (or 202) answer
	sent     int64 // when the earliest attempt that could have brought its first copy was sent
	firstPos int   // its first copy's place in the handler's log
	firstAt  int64
}

// ruleOrder — order, in real time: for deliveries A and B of one tunnel
// whose first copies reached one handler (a route's of one agent), both
// accepted (answered 2xx or 202), if A's accepting answer (its first 2xx)
// came before B was sent, that handler's first copy of A precedes its
// first copy of B: queued before live, and within a call, where the sender
// sends an event once the one before was accepted, in the order sent. Each
// handler gets its events in order; a slow handler of one route, or an
// agent away, holds up no other, so two handlers' requests may pass each
// other (a run without routes or claimants has one). "B was sent" is the
// earliest attempt of B that could have brought its first copy
// (couldCause): an attempt stuck without an answer since before A was
// accepted may rightly arrive first. A B whose first copy no attempt
// accounts for is left to ruleDeliveredAfterRefusal. One violation per B,
// naming the A whose first copy came last.
func ruleOrder(ix *index) []Violation {
	type line struct{ tunnel, seat, route string }
	byLine := map[line][]accept{}
	for _, d := range ix.order {
		a := ix.accepted(d)
		if a < 0 || len(ix.copies[d]) == 0 {
			continue
		}
		first := ix.copies[d][0]
		sent, ok := ix.firstCause(d, first)
		if !ok {
			continue
		}
		s := ix.h.Sends[a]
		l := line{s.Tunnel, ix.h.Handler[first].Seat, ix.h.Handler[first].Route}
		byLine[l] = append(byLine[l], accept{d: d, at: s.AnsweredAt, sent: sent,
			firstPos: first, firstAt: ix.h.Handler[first].ReceivedAt})
	}
	var out []Violation
	for _, as := range byLine {
		out = append(out, ix.orderIn(as)...)
	}
	return out
}

// orderIn checks one tunnel's route: a sweep over B by send time, keeping the latest
// first copy among the A accepted before.
func (ix *index) orderIn(as []accept) []Violation {
	byAt := slices.Clone(as)
	slices.SortFunc(byAt, func(a, b accept) int { return cmp.Compare(a.at, b.at) })
	bySent := slices.Clone(as)
	slices.SortFunc(bySent, func(a, b accept) int { return cmp.Or(cmp.Compare(a.sent, b.sent), cmp.Compare(a.d, b.d)) })
	var out []Violation
	j, latest := 0, accept{firstPos: -1}
	for _, b := range bySent {
		for ; j < len(byAt) && byAt[j].at < b.sent; j++ {
			if byAt[j].firstPos > latest.firstPos {
				latest = byAt[j]
			}
		}
		if latest.firstPos < b.firstPos {
			continue
		}
		out = append(out, ix.violation(KindOrder, "Order", b.d, b.firstAt,
			"reached the handler at %s, before %s (at %s), though %s was accepted at %s and this one sent at %s",
			ix.rel(b.firstAt), latest.d, ix.rel(latest.firstAt), latest.d, ix.rel(latest.at), ix.rel(b.sent)))
	}
	return out
}

// crashLead lets a crash count for a copy the handler logged just after it:
// the agent may die with the request already on its way.
const crashLead = int64(5 * time.Second)

// ruleExtraCopy — once: every handler copy of a delivery after the first
// needs a cause of its own. Copies are matched to sends of the delivery,
// one send each: first each copy whose answer a 2xx carries, to that send;
// then, in the handler's order, each other copy to an unused send that
// could have caused it (couldCause: a 202, no answer or a 503
// outcome_unknown, or still waiting),
// the one whose wait ends soonest. A later copy left without a send needs
// a crash (isCrash) that began between the first copy (less crashLead) and
// it. Otherwise the handler saw the request again without a crash or a
// re-send: a duplicate calltap made.
func ruleExtraCopy(ix *index) []Violation {
	var out []Violation
	for _, d := range ix.order {
		cs := ix.copies[d]
		if len(cs) < 2 {
			continue
		}
		for k, ci := range ix.unmatchedCopies(d) {
			c := ix.h.Handler[ci]
			if k == 0 && ci == cs[0] || ix.crashBetween(ix.h.Handler[cs[0]].ReceivedAt-crashLead, c.ReceivedAt) {
				continue
			}
			list, _, _ := ix.attempts(d, c.ReceivedAt)
			out = append(out, ix.violation(KindOnce, "ExtraCopy", d, c.ReceivedAt,
				"the handler got it again at %s (%d copies in all) with no re-send of its own and no crash since the first copy at %s; attempts before: %s",
				ix.rel(c.ReceivedAt), len(cs), ix.rel(ix.h.Handler[cs[0]].ReceivedAt), list))
		}
	}
	return out
}

// unmatchedCopies returns the copies of d no send accounts for, in the
// handler's order.
func (ix *index) unmatchedCopies(d string) []int {
	used := map[int]bool{}
	paired := map[int]bool{}
	for _, i := range ix.sends[d] {
		if ci, ok := ix.answered[i]; ok && ci >= 0 && !paired[ci] {
			paired[ci], used[i] = true, true
		}
	}
	var left []int
	for _, ci := range ix.copies[d] {
		if paired[ci] {
			continue
		}
		best, end := -1, int64(math.MaxInt64)
		for _, i := range ix.sends[d] {
			if used[i] || !ix.couldCause(i, ci) {
				continue
			}
			if e := waitEnd(ix.h.Sends[i]); best < 0 || e < end {
				best, end = i, e
			}
		}
		if best < 0 {
			left = append(left, ci)
			continue
		}
		used[best] = true
	}
	return left
}

// waitEnd is when a send stops being a possible cause of a new copy.
func waitEnd(s history.Send) int64 {
	if toldFailed(s) {
		return s.AnsweredAt + stampSlack
	}
	return math.MaxInt64
}

func (ix *index) crashBetween(from, to int64) bool {
	for _, f := range ix.crashes {
		if f.Start >= from && f.Start <= to {
			return true
		}
	}
	return false
}

// ruleDuplicateMarked — once, in the store: the captures of a delivery, by
// received_at, are one first capture with no duplicate_of and then
// captures each marked duplicate_of that first one's capture id.
func ruleDuplicateMarked(ix *index) []Violation {
	var out []Violation
	for d, ps := range ix.captures {
		first := ix.h.Store[ps[0]]
		if first.DuplicateOf != "" {
			out = append(out, ix.violation(KindOnce, "DuplicateMarked", d, first.ReceivedAt,
				"the delivery's first capture %s is marked duplicate_of %s, which is not an earlier capture",
				first.CaptureID, first.DuplicateOf))
		}
		for _, p := range ps[1:] {
			c := ix.h.Store[p]
			if c.DuplicateOf == first.CaptureID {
				continue
			}
			out = append(out, ix.violation(KindOnce, "DuplicateMarked", d, c.ReceivedAt,
				"capture %s is a second capture of the delivery but is marked duplicate_of %q, not the first capture %s",
				c.CaptureID, c.DuplicateOf, first.CaptureID))
		}
	}
	return out
}

// pendingStates are the store's words for "not done yet".
var pendingStates = []string{"pending", "queued"}

// ruleNothingPending — once, drained: after the run drained no capture is
// still pending or queued: the agent delivers what it holds.
func ruleNothingPending(ix *index) []Violation {
	var out []Violation
	for _, c := range ix.h.Store {
		if !slices.Contains(pendingStates, c.State) {
			continue
		}
		out = append(out, ix.violation(KindOnce, "NothingPending", c.DeliveryID, ix.h.Meta.Drained,
			"capture %s (received at %s) is still %s after the run drained", c.CaptureID, ix.rel(c.ReceivedAt), c.State))
	}
	return out
}
