package check

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/calltap/calltap/scripts/chaos/history"
)

// base is the synthetic runs' start, in Unix nanoseconds.
const base = int64(1_790_000_000_000_000_000)

func at(sec float64) int64 { return base + int64(sec*1e9) }

// run builds a small history by hand. Times are seconds from the start.
type run struct{ h history.History }

func newRun() *run {
	return &run{h: history.History{Meta: history.Meta{Seed: 7, Mode: history.ModeSingle, Minutes: 1,
		Started: base, Ended: at(60), Drained: at(70),
		Bounds: history.Bounds{AnswerMaxMS: 5000, No2xxMaxMS: 10000}}}}
}

// answer is the handler's answer body for copy n of delivery d.
func answer(d string, n int) string { return fmt.Sprintf(`{"delivery_id":%q,"copy":%d}`, d, n) }

const (
	queued202 = `{"status":true,"message":"queued","data":{"id":"r1","queued":true,"status":"queued"},"error":null}`
	agentLost = `{"status":false,"message":"agent lost","data":null,"error":{"code":"bad_gateway","message":"the agent saved the request but disconnected"}}`
)

func envelope(code string) string {
	return fmt.Sprintf(`{"status":false,"message":"m","data":null,"error":{"code":%q,"message":"m"}}`, code)
}

// send records an attempt; answered 0 means none (status 0).
func (r *run) send(d string, attempt int, sent, answered float64, status int, body, retryAfter string) *run {
	s := history.Send{Sender: "s1", Tunnel: "t1", CallID: "c-" + d, DeliveryID: d, Event: "call.started",
		Attempt: attempt, SentAt: at(sent), Status: status, Body: body, RetryAfter: retryAfter}
	if answered > 0 {
		s.AnsweredAt = at(answered)
	}
	r.h.Sends = append(r.h.Sends, s)
	return r
}

// ok records an attempt answered 200 with the handler's copy n, and that copy.
func (r *run) ok(d string, attempt int, sent, received, answered float64, n int) *run {
	r.copy(d, received, n)
	return r.send(d, attempt, sent, answered, 200, answer(d, n), "")
}

func (r *run) copy(d string, received float64, n int) *run {
	r.h.Handler = append(r.h.Handler, history.Copy{ReceivedAt: at(received), Tunnel: "t1", DeliveryID: d,
		CallID: "c-" + d, Status: 200, AnswerBody: answer(d, n)})
	return r
}

func (r *run) capture(id, d string, received float64, state string, status int, dupOf string) *run {
	r.h.Store = append(r.h.Store, history.Capture{CaptureID: id, Tunnel: "t1", DeliveryID: d,
		ReceivedAt: at(received), State: state, ResponseStatus: status, DuplicateOf: dupOf})
	return r
}

// queued marks the last capture queued, as the agent does for what the
// relay queued (or it held behind earlier requests).
func (r *run) queued() *run {
	r.h.Store[len(r.h.Store)-1].Queued = true
	return r
}

// errorText sets the error of the last capture.
func (r *run) errorText(e string) *run {
	r.h.Store[len(r.h.Store)-1].Error = e
	return r
}

func (r *run) fault(kind, target string, start, end float64) *run {
	r.h.Faults = append(r.h.Faults, history.Fault{Start: at(start), End: at(end), Kind: kind, Target: target})
	return r
}

// clean is two deliveries of one tunnel, each answered by the handler and
// saved.
func clean() *run {
	return newRun().
		ok("d1", 1, 1, 1.01, 1.02, 1).capture("p1", "d1", 1.005, "delivered", 200, "").
		ok("d2", 1, 2, 2.01, 2.02, 1).capture("p2", "d2", 2.005, "delivered", 200, "")
}

// routed gives the run the chaos run's routes (media by event kind, then
// alice by developer; the rest the default's) and puts the copies of clean's
// two deliveries, call.started naming nobody, at the default's handler.
func (r *run) routed() *run {
	r.h.Meta.Routes = []history.Route{
		{Name: "media", Events: []string{"call.recording_*", "call.analysis_*"}},
		{Name: "alice", Developer: "alice"},
	}
	return r.to("d1", history.DefaultRoute).to("d2", history.DefaultRoute)
}

// of makes d's sends so far an event of kind of call, whose body names
// developer ("" for none).
func (r *run) of(d, kind, call, developer string) *run {
	for i, s := range r.h.Sends {
		if s.DeliveryID == d {
			r.h.Sends[i].Event, r.h.Sends[i].CallID, r.h.Sends[i].Developer = kind, call, developer
		}
	}
	return r
}

// to puts d's copies so far at route's handler.
func (r *run) to(d, route string) *run {
	for i, c := range r.h.Handler {
		if c.DeliveryID == d {
			r.h.Handler[i].Route = route
		}
	}
	return r
}

// aliceCall is a call of alice's whose call.started (d3) alone names her:
// its call.connected (d4) was sent after the call.started was accepted and
// goes to route connected; its call.recording_available (d5) to media; and
// a call of bob's (d6), whom no route names, to the default.
func aliceCall(connected string) *run {
	return clean().
		ok("d3", 1, 3, 3.01, 3.02, 1).capture("p3", "d3", 3.005, "delivered", 200, "").
		of("d3", "call.started", "c-alice", "alice").to("d3", "alice").
		ok("d4", 1, 4, 4.01, 4.02, 1).capture("p4", "d4", 4.005, "delivered", 200, "").
		of("d4", "call.connected", "c-alice", "").to("d4", connected).
		ok("d5", 1, 5, 5.01, 5.02, 1).capture("p5", "d5", 5.005, "delivered", 200, "").
		of("d5", "call.recording_available", "c-alice", "").to("d5", "media").
		ok("d6", 1, 6, 6.01, 6.02, 1).capture("p6", "d6", 6.005, "delivered", 200, "").
		of("d6", "call.started", "c-bob", "bob").to("d6", history.DefaultRoute).
		routed()
}

// earlyConnected is alice's call whose call.started (d3) was refused at
// first and accepted on its retry, while its call.connected (d4), sent in
// between, went to route connected: the agent had not seen the call.started.
func earlyConnected(connected string) *run {
	return clean().send("d3", 1, 3, 3.01, 503, envelope("agent_offline"), "5").
		ok("d4", 1, 3.5, 3.51, 3.52, 1).capture("p4", "d4", 3.505, "delivered", 200, "").
		of("d4", "call.connected", "c-alice", "").to("d4", connected).
		ok("d3", 2, 8, 8.01, 8.02, 1).capture("p3", "d3", 8.005, "delivered", 200, "").
		of("d3", "call.started", "c-alice", "alice").to("d3", "alice").
		routed()
}

// strayCall is alice's call (d3 names her) whose call.connected (d4)
// names bob, accepted at bobAccepted, and whose call.ended (d5), naming
// nobody and sent at 5 s, reached route endedAt: the agent recalls the
// developer the call's events last named, bob once it has seen d4.
func strayCall(bobAccepted float64, endedAt string) *run {
	return clean().
		ok("d3", 1, 3, 3.01, 3.02, 1).capture("p3", "d3", 3.005, "delivered", 200, "").
		of("d3", "call.started", "c-alice", "alice").to("d3", "alice").
		ok("d4", 1, 4, bobAccepted-0.01, bobAccepted, 1).capture("p4", "d4", 4.005, "delivered", 200, "").
		of("d4", "call.connected", "c-alice", "bob").to("d4", history.DefaultRoute).
		ok("d5", 1, 5, 5.01, 5.02, 1).capture("p5", "d5", 5.005, "delivered", 200, "").
		of("d5", "call.ended", "c-alice", "").to("d5", endedAt).
		routed()
}

// claimed gives the run claimant agents beside the default one: alice and
// bob each claim their developer's calls; the rest is the default agent's.
func (r *run) claimed() *run {
	r.h.Meta.Mode = history.ModeTeam
	r.h.Meta.Claimants = []history.Claimant{{Name: "alice", Developer: "alice"}, {Name: "bob", Developer: "bob"}}
	return r
}

// seat puts d's copies and captures so far at claimant seat's agent (""
// for the default agent's).
func (r *run) seat(d, seat string) *run {
	for i, c := range r.h.Handler {
		if c.DeliveryID == d {
			r.h.Handler[i].Seat = seat
		}
	}
	for i, c := range r.h.Store {
		if c.DeliveryID == d {
			r.h.Store[i].Seat = seat
		}
	}
	return r
}

// aliceClaims is a call of alice's (c-alice) whose call.started (d3) names
// her: its call.connected (d4), naming nobody, went to connectedSeat's
// agent, its call.ended (d5), naming bob, to alice's; and a call of
// dave's (d6), whom nobody claims, to the default agent, as do clean's.
func aliceClaims(connectedSeat string) *run {
	r := clean().claimed()
	for i, e := range []struct{ kind, call, developer, seat string }{
		{"call.started", "c-alice", "alice", "alice"},
		{"call.connected", "c-alice", "", connectedSeat},
		{"call.ended", "c-alice", "bob", "alice"},
		{"call.started", "c-dave", "dave", ""},
	} {
		d, sec := fmt.Sprint("d", i+3), float64(i+3)
		r.ok(d, 1, sec, sec+0.01, sec+0.02, 1).capture(fmt.Sprint("p", i+3), d, sec+0.005, "delivered", 200, "").
			of(d, e.kind, e.call, e.developer).seat(d, e.seat)
	}
	return r
}

// earlyClaim is alice's call whose call.started (d3) was refused at first
// and accepted on its retry, while its call.connected (d4), naming nobody,
// sent in between, reached connectedSeat's agent: the relay may have
// routed it first, and the call with it.
func earlyClaim(connectedSeat, startedSeat string) *run {
	return clean().claimed().send("d3", 1, 3, 3.01, 503, envelope("unavailable"), "5").
		ok("d4", 1, 3.5, 3.51, 3.52, 1).capture("p4", "d4", 3.505, "delivered", 200, "").
		of("d4", "call.connected", "c-alice", "").seat("d4", connectedSeat).
		ok("d3", 2, 8, 8.01, 8.02, 1).capture("p3", "d3", 8.005, "delivered", 200, "").
		of("d3", "call.started", "c-alice", "alice").seat("d3", startedSeat)
}

// aliceAway is alice's call.started (d3) and call.connected (d4), both
// queued (202) while her agent was away and delivered to it when it came
// back, d3 first unless swapped; bob's call.started (d7), live in between,
// passes them.
func aliceAway(swapped bool) *run {
	r := clean().claimed().
		send("d3", 1, 3, 3.01, 202, queued202, "").of("d3", "call.started", "c-alice", "alice").
		send("d4", 1, 4, 4.01, 202, queued202, "").of("d4", "call.connected", "c-alice", "").
		ok("d7", 1, 5, 5.01, 5.02, 1).capture("p7", "d7", 5.005, "delivered", 200, "").
		of("d7", "call.started", "c-bob", "bob").seat("d7", "bob")
	first, second := "d3", "d4"
	if swapped {
		first, second = second, first
	}
	return r.copy(first, 10, 1).capture("p"+first, first, 9.99, "delivered", 200, "").queued().seat(first, "alice").
		copy(second, 10.1, 1).capture("p"+second, second, 10.09, "delivered", 200, "").queued().seat(second, "alice")
}

// fullDiskAfterForward is a request the handler got while the agent's disk
// was full, whose sender was answered 503 (body, Retry-After retryAfter)
// once the save failed, and which its retry brought again.
func fullDiskAfterForward(body, retryAfter string) *run {
	return clean().fault(history.FaultDiskFull, "agent", 2.5, 4).
		copy("d3", 3.01, 1).send("d3", 1, 3, 3.2, 503, body, retryAfter).
		ok("d3", 2, 8, 8.01, 8.02, 2).
		capture("p3", "d3", 8.005, "delivered", 200, "")
}

// answerLost is a request a relay node answered 503 (body) because the
// holding node's answer was lost, and that reached the handler 139 ms
// after the 503, then again through its retry.
func answerLost(body string) *run {
	return clean().send("d3", 1, 3, 3.1, 503, body, "5").copy("d3", 3.239, 1).
		capture("p3", "d3", 3.2, "delivered", 200, "").
		ok("d3", 2, 8, 8.01, 8.02, 2).capture("p3b", "d3", 8.005, "delivered", 200, "p3")
}

// nodeSilent is a request whose sender's node waited out its forward
// timeout while the holding node had it, answered 504 (body), and whose
// copy reached the handler after, then again through the retry.
func nodeSilent(body string) *run {
	return clean().send("d3", 1, 3, 38, 504, body, "5").copy("d3", 38.1, 1).
		capture("p3", "d3", 38.05, "delivered", 200, "").
		ok("d3", 2, 40, 40.01, 40.02, 2).capture("p3b", "d3", 40.005, "delivered", 200, "p3")
}

// unconfirmedQueueing is a request whose first attempt a relay node could
// not confirm queueing (503, body) though it was stored; a request queued
// after it (d3), and its retry, queued too: the drain delivers the first
// attempt first, then d3, then the retry, marked a duplicate.
func unconfirmedQueueing(body string) *run {
	return clean().send("d4", 1, 1, 3, 503, body, "30").
		send("d3", 1, 3.5, 3.6, 202, queued202, "").
		send("d4", 2, 4, 4.1, 202, queued202, "").
		copy("d4", 5, 1).capture("p4", "d4", 4.99, "delivered", 200, "").queued().
		copy("d3", 5.1, 1).capture("p3", "d3", 5.09, "delivered", 200, "").queued().
		copy("d4", 5.2, 2).capture("p4b", "d4", 5.19, "delivered", 200, "p4").queued()
}

// TestCheck feeds the checker hand-built histories: each broken one must be
// caught by exactly the rules listed, and each sound one (edge cases
// included) must pass. Removing a rule fails its row.
func TestCheck(t *testing.T) {
	cases := []struct {
		name string
		h    *run
		want []string // the rules expected to fire, sorted
	}{
		{"clean", clean(), nil},
		{"lost 2xx: a queued 202 that never reached the handler",
			clean().send("d3", 1, 3, 3.01, 202, queued202, "").capture("p3", "d3", 3.005, "failed", 0, ""),
			[]string{"Lost2xx"}},
		{"lost 2xx: answered 200, not in the store",
			clean().ok("d3", 1, 3, 3.01, 3.02, 1),
			[]string{"NotInStore"}},
		{"invented 200: a body no handler copy gave",
			clean().copy("d3", 3.01, 1).send("d3", 1, 3, 3.02, 200, answer("d3", 7), "").
				capture("p3", "d3", 3.005, "delivered", 200, ""),
			[]string{"Invented2xx"}},
		{"invented 200: the handler never saw it",
			clean().send("d3", 1, 3, 3.02, 200, answer("d3", 1), "").capture("p3", "d3", 3.005, "failed", 0, ""),
			[]string{"Invented2xx", "Lost2xx"}},
		{"invented 200: the handler's body given before the handler answered",
			clean().copy("d3", 3.5, 1).send("d3", 1, 3, 3.02, 200, answer("d3", 1), "").
				capture("p3", "d3", 3.005, "delivered", 200, ""),
			[]string{"Invented2xx"}},
		{"a bare 502: no Retry-After",
			clean().send("d3", 1, 3, 3.1, 502, agentLost, ""),
			[]string{"UndocumentedRefusal"}},
		{"a 403 is not a documented refusal",
			clean().send("d3", 1, 3, 3.1, 403, envelope("forbidden"), ""),
			[]string{"UndocumentedRefusal"}},
		{"a 429 without Retry-After",
			clean().send("d3", 1, 3, 3.1, 429, envelope("rate_limited"), ""),
			[]string{"UndocumentedRefusal"}},
		{"documented refusals pass: 404, 413, 429 with Retry-After, 503 with Retry-After, no answer",
			clean().send("d3", 1, 3, 3.1, 404, envelope("not_found"), "").
				send("d4", 1, 3, 3.1, 413, envelope("payload_too_large"), "").
				send("d5", 1, 3, 3.1, 429, envelope("rate_limited"), "1").
				send("d6", 1, 3, 3.1, 503, envelope("agent_offline"), "30").
				send("d7", 1, 3, 0, 0, "", ""),
			nil},
		{"a 503-answered request delivered 20 s later",
			clean().send("d3", 1, 3, 3.1, 503, envelope("unavailable"), "5").copy("d3", 23, 1).
				capture("p3", "d3", 22.9, "delivered", 200, ""),
			[]string{"DeliveredAfterRefusal"}},
		{"refused while its frame was on the way to the agent, re-sent and queued, the first copy came live",
			newRun().send("q", 1, 0.5, 0.6, 202, queued202, "").capture("pq", "q", 0.55, "delivered", 200, "").queued().
				send("d1", 1, 0.8, 1.5, 503, envelope("agent_offline"), "5").
				send("d1", 2, 1.8, 1.81, 202, queued202, "").
				copy("d1", 1.82, 1).capture("p1", "d1", 1.819, "delivered", 200, "").
				copy("q", 3, 1).
				copy("d1", 3.1, 2).capture("p1b", "d1", 3.09, "delivered", 200, "p1").queued(),
			[]string{"DeliveredAfterRefusal"}},
		{"refused as the agent's link dropped, the copy stamped a hair after the refusal: the fault excuses it",
			clean().fault(history.FaultNetDrop, "agent->relay", 2.5, 4).
				send("d3", 1, 3, 3.1, 503, envelope("agent_offline"), "5").copy("d3", 3.1002, 1).
				capture("p3", "d3", 3.1, "delivered", 200, "").
				ok("d3", 2, 4, 4.01, 4.02, 2).capture("p3b", "d3", 4.005, "delivered", 200, "p3"),
			nil},
		{"the same with no fault",
			clean().send("d3", 1, 3, 3.1, 503, envelope("agent_offline"), "5").copy("d3", 3.1002, 1).
				capture("p3", "d3", 3.1, "delivered", 200, "").
				ok("d3", 2, 4, 4.01, 4.02, 2).capture("p3b", "d3", 4.005, "delivered", 200, "p3"),
			[]string{"RefusedAfterDelivery"}},
		{"a copy no sender sent",
			clean().copy("d3", 3, 1),
			[]string{"DeliveredAfterRefusal"}},
		{"refused 502 after the handler processed it, no fault",
			clean().copy("d3", 3.01, 1).send("d3", 1, 3, 3.2, 502, agentLost, "5").
				ok("d3", 2, 8, 8.01, 8.02, 2).
				capture("p3", "d3", 3.005, "failed", 0, "").capture("p3b", "d3", 8.005, "delivered", 200, "p3"),
			[]string{"RefusedAfterDelivery"}},
		{"refused 502 after the handler processed it, the agent's link cut: passes",
			clean().fault(history.FaultNetCut, "agent->relay-1", 3.1, 4).
				copy("d3", 3.01, 1).send("d3", 1, 3, 3.2, 502, agentLost, "5").
				ok("d3", 2, 8, 8.01, 8.02, 2).
				capture("p3", "d3", 3.005, "delivered", 200, "").capture("p3b", "d3", 8.005, "delivered", 200, "p3"),
			nil},
		{"a full disk does not excuse a 502 after the handler processed it",
			clean().fault(history.FaultDiskFull, "agent", 2.5, 4).
				copy("d3", 3.01, 1).send("d3", 1, 3, 3.2, 502, agentLost, "5").
				ok("d3", 2, 8, 8.01, 8.02, 2).
				capture("p3", "d3", 8.005, "delivered", 200, ""),
			[]string{"RefusedAfterDelivery"}},
		{"the agent's save failed after the forward on a full disk: 503 outcome_unknown passes",
			fullDiskAfterForward(envelope("outcome_unknown"), "5"),
			nil},
		{"the same answered 503 disk_full",
			fullDiskAfterForward(envelope("disk_full"), "5"),
			[]string{"RefusedAfterDelivery"}},
		{"the same answered 503 unavailable",
			fullDiskAfterForward(envelope("unavailable"), "5"),
			[]string{"RefusedAfterDelivery"}},
		{"503 outcome_unknown without Retry-After is no answer a sender can act on",
			fullDiskAfterForward(envelope("outcome_unknown"), ""),
			[]string{"RefusedAfterDelivery", "UndocumentedRefusal"}},
		{"a relay node lost the holder's answer, the copy reached the handler after: 503 outcome_unknown passes",
			answerLost(envelope("outcome_unknown")),
			nil},
		{"the same answered 503 unavailable",
			answerLost(envelope("unavailable")),
			[]string{"DeliveredAfterRefusal"}},
		{"the same answered 503 disk_full",
			answerLost(envelope("disk_full")),
			[]string{"DeliveredAfterRefusal"}},
		{"a node silent past the forward timeout, the copy reached the handler after: 504 outcome_unknown passes",
			nodeSilent(envelope("outcome_unknown")),
			nil},
		{"the same answered 504 gateway_timeout",
			nodeSilent(envelope("gateway_timeout")),
			[]string{"DeliveredAfterRefusal"}},
		{"a queueing the relay could not confirm, stored all the same and drained first: 503 outcome_unknown passes",
			unconfirmedQueueing(envelope("outcome_unknown")),
			nil},
		{"the same answered 503 unavailable",
			unconfirmedQueueing(envelope("unavailable")),
			[]string{"ExtraCopy", "Order"}},
		{"reorder: a live request overtakes a queued one",
			clean().send("d3", 1, 3, 3.01, 202, queued202, "").capture("p3", "d3", 3.005, "delivered", 200, "").queued().
				ok("d4", 1, 4, 4.01, 4.02, 1).capture("p4", "d4", 4.005, "delivered", 200, "").
				copy("d3", 5, 1),
			[]string{"Order"}},
		{"queued before live: passes",
			clean().send("d3", 1, 3, 3.01, 202, queued202, "").capture("p3", "d3", 3.005, "delivered", 200, "").queued().
				copy("d3", 3.5, 1).
				ok("d4", 1, 4, 4.01, 4.02, 1).capture("p4", "d4", 4.005, "delivered", 200, ""),
			nil},
		{"an attempt stuck without an answer since before a queued one was accepted may arrive first",
			clean().send("d4", 1, 2.5, 0, 0, "", "").
				send("d3", 1, 3, 3.01, 202, queued202, "").capture("p3", "d3", 3.005, "delivered", 200, "").queued().
				copy("d4", 5, 1).capture("p4", "d4", 4.9, "delivered", 200, "").
				ok("d4", 2, 4, 5.01, 5.02, 2).capture("p4b", "d4", 5.005, "delivered", 200, "p4").
				copy("d3", 6, 1),
			nil},
		{"concurrent requests may reach the handler in either order",
			newRun().copy("d2", 1.01, 1).copy("d1", 1.02, 1).
				send("d1", 1, 1, 1.03, 200, answer("d1", 1), "").send("d2", 1, 1, 1.03, 200, answer("d2", 1), "").
				capture("p1", "d1", 1.005, "delivered", 200, "").capture("p2", "d2", 1.005, "delivered", 200, ""),
			nil},
		{"the store says failed; the sender got 200",
			newRun().ok("d1", 1, 1, 1.01, 1.02, 1).capture("p1", "d1", 1.005, "failed", 0, ""),
			[]string{"StoreOutcome"}},
		{"the store says the outcome is unknown: passes",
			newRun().ok("d1", 1, 1, 1.01, 1.02, 1).capture("p1", "d1", 1.005, "interrupted", 0, ""),
			nil},
		{"the store says failed, interrupted: passes",
			newRun().ok("d1", 1, 1, 1.01, 1.02, 1).capture("p1", "d1", 1.005, "failed", 0, "").errorText("interrupted: the agent stopped"),
			nil},
		{"the store says failed for another reason; the sender got 200",
			newRun().ok("d1", 1, 1, 1.01, 1.02, 1).capture("p1", "d1", 1.005, "failed", 0, "").errorText("handler unreachable"),
			[]string{"StoreOutcome"}},
		{"the store says delivered with a status the handler never gave",
			clean().copy("d3", 3.01, 1).send("d3", 1, 3, 0, 0, "", "").capture("p3", "d3", 3.005, "delivered", 500, ""),
			[]string{"StoreStatus"}},
		{"unmarked duplicate after a crash",
			clean().fault(history.FaultSigkill, "agent", 3.05, 4).
				copy("d3", 3.01, 1).send("d3", 1, 3, 3.2, 502, agentLost, "5").
				ok("d3", 2, 8, 8.01, 8.02, 2).
				capture("p3", "d3", 3.005, "interrupted", 0, "").capture("p3b", "d3", 8.005, "delivered", 200, ""),
			[]string{"DuplicateMarked"}},
		{"duplicate after a crash of the agent, re-sent and marked: passes",
			clean().fault(history.FaultSigkill, "agent", 3.05, 4).
				copy("d3", 3.01, 1).send("d3", 1, 3, 3.2, 502, agentLost, "5").
				ok("d3", 2, 8, 8.01, 8.02, 2).
				capture("p3", "d3", 3.005, "interrupted", 0, "").capture("p3b", "d3", 8.005, "delivered", 200, "p3"),
			nil},
		{"a queued request delivered again after the relay node was killed, no re-send: passes",
			clean().send("d3", 1, 3, 3.01, 202, queued202, "").copy("d3", 3.5, 1).
				fault(history.FaultSigkill, "relay-2", 3.6, 5).copy("d3", 6, 2).
				capture("p3", "d3", 3.005, "delivered", 200, "").queued().capture("p3b", "d3", 6, "delivered", 200, "p3").queued(),
			nil},
		{"the same after a SIGTERM of the single relay: passes",
			clean().send("d3", 1, 3, 3.01, 202, queued202, "").copy("d3", 3.5, 1).
				fault(history.FaultSigterm, "relay", 3.6, 5).copy("d3", 6, 2).
				capture("p3", "d3", 3.005, "delivered", 200, "").queued().capture("p3b", "d3", 6, "delivered", 200, "p3").queued(),
			nil},
		{"a queued request delivered twice, no crash",
			clean().send("d3", 1, 3, 3.01, 202, queued202, "").copy("d3", 3.5, 1).copy("d3", 6, 2).
				capture("p3", "d3", 3.005, "delivered", 200, "").queued().capture("p3b", "d3", 6, "delivered", 200, "p3").queued(),
			[]string{"ExtraCopy"}},
		{"an agent's SIGTERM is no crash",
			clean().send("d3", 1, 3, 3.01, 202, queued202, "").copy("d3", 3.5, 1).
				fault(history.FaultSigterm, "agent", 3.6, 5).copy("d3", 6, 2).
				capture("p3", "d3", 3.005, "delivered", 200, "").queued().capture("p3b", "d3", 6, "delivered", 200, "p3").queued(),
			[]string{"ExtraCopy"}},
		{"refused by the relay before the agent, then delivered twice on the retry",
			clean().send("d3", 1, 3, 3.01, 503, envelope("agent_offline"), "30").
				copy("d3", 8.01, 1).copy("d3", 8.02, 2).send("d3", 2, 8, 8.03, 200, answer("d3", 1), "").
				capture("p3", "d3", 8.005, "delivered", 200, "").capture("p3b", "d3", 8.006, "delivered", 200, "p3"),
			[]string{"ExtraCopy"}},
		{"no answer (timeout), re-sent, both copies reach the handler: passes",
			clean().send("d3", 1, 3, 0, 0, "", "").copy("d3", 9, 1).ok("d3", 2, 8, 9.5, 9.6, 2).
				capture("p3", "d3", 8.9, "delivered", 200, "").capture("p3b", "d3", 9.4, "delivered", 200, "p3"),
			nil},
		{"routes: alice's call.connected follows her call.started, her recording goes to media, bob's call to the default",
			aliceCall("alice"),
			nil},
		{"routes: alice's call.connected, sent after her call.started was accepted, at the default's handler",
			aliceCall(history.DefaultRoute),
			[]string{"Route"}},
		{"routes: a call.started naming nobody at the media handler",
			clean().routed().ok("d3", 1, 3, 3.01, 3.02, 1).capture("p3", "d3", 3.005, "delivered", 200, "").
				of("d3", "call.started", "c-x", "").to("d3", "media"),
			[]string{"Route"}},
		{"routes: a recording of alice's call at her handler: media, tried first, takes it",
			aliceCall("alice").to("d5", "alice"),
			[]string{"Route"}},
		{"routes: a call.connected sent before its call.started was accepted may go to the default",
			earlyConnected(history.DefaultRoute),
			nil},
		{"routes: ... or to alice",
			earlyConnected("alice"),
			nil},
		{"routes: ... but to no other",
			earlyConnected("media"),
			[]string{"Route"}},
		{"routes: a request at a handler of no route",
			clean().routed().to("d2", "bob"),
			[]string{"Route"}},
		{"routes: a live request of one route may pass a queued one of another",
			clean().routed().send("d3", 1, 3, 3.01, 202, queued202, "").capture("p3", "d3", 3.005, "delivered", 200, "").queued().
				of("d3", "call.recording_available", "c-x", "").
				ok("d4", 1, 4, 4.01, 4.02, 1).capture("p4", "d4", 4.005, "delivered", 200, "").to("d4", history.DefaultRoute).
				copy("d3", 5, 1).to("d3", "media"),
			nil},
		{"routes: ... but not one of its own route",
			clean().routed().send("d3", 1, 3, 3.01, 202, queued202, "").capture("p3", "d3", 3.005, "delivered", 200, "").queued().
				ok("d4", 1, 4, 4.01, 4.02, 1).capture("p4", "d4", 4.005, "delivered", 200, "").to("d4", history.DefaultRoute).
				copy("d3", 5, 1).to("d3", history.DefaultRoute),
			[]string{"Order"}},
		{"routes: a call.ended naming nobody follows the developer its call's events last named (bob, after alice): the default",
			strayCall(4.02, history.DefaultRoute),
			nil},
		{"routes: ... not the first one (alice)",
			strayCall(4.02, "alice"),
			[]string{"Route"}},
		{"routes: ... which it may, when the event naming bob was not yet accepted",
			strayCall(6, "alice"),
			nil},
		{"claims: a request in flight to alice's frozen agent, answered 202, reaches her live when she wakes",
			clean().claimed().fault(history.FaultSigstop, "agent-alice", 2.5, 6).
				send("d3", 1, 3, 5.5, 202, queued202, "").of("d3", "call.started", "c-alice", "alice").
				copy("d3", 6.1, 1).capture("p3", "d3", 3.005, "delivered", 200, "").seat("d3", "alice"),
			nil},
		{"claims: ... and so while her link to the relay is slowed past the relay's 3 s for a pong",
			clean().claimed().fault(history.FaultNetSlow, "agent-alice->relay-0", 2.5, 6).
				send("d3", 1, 3, 5.5, 202, queued202, "").of("d3", "call.started", "c-alice", "alice").
				copy("d3", 6.1, 1).capture("p3", "d3", 3.005, "delivered", 200, "").seat("d3", "alice"),
			nil},
		{"claims: ... but not while bob's link was the slowed one",
			clean().claimed().fault(history.FaultNetSlow, "agent-bob->relay-0", 2.5, 6).
				send("d3", 1, 3, 5.5, 202, queued202, "").of("d3", "call.started", "c-alice", "alice").
				copy("d3", 6.1, 1).capture("p3", "d3", 3.005, "delivered", 200, "").seat("d3", "alice"),
			[]string{"DeliveredAfterRefusal"}},
		{"claims: ... but not while another agent (bob's) was the one frozen",
			clean().claimed().fault(history.FaultSigstop, "agent-bob", 2.5, 6).
				send("d3", 1, 3, 5.5, 202, queued202, "").of("d3", "call.started", "c-alice", "alice").
				copy("d3", 6.1, 1).capture("p3", "d3", 3.005, "delivered", 200, "").seat("d3", "alice"),
			[]string{"DeliveredAfterRefusal"}},
		{"claims: alice's call at her agent, its later events following her whatever they name; dave's call at the default",
			aliceClaims("alice"),
			nil},
		{"claims: alice's call.connected, sent after her call.started was accepted, at the default agent",
			aliceClaims(""),
			[]string{"Claim", "ClaimStore"}},
		{"claims: alice's call.ended, naming bob, at bob's agent",
			aliceClaims("alice").seat("d5", "bob"),
			[]string{"Claim", "ClaimStore"}},
		{"claims: dave's call, which nobody claims, at alice's agent",
			aliceClaims("alice").seat("d6", "alice"),
			[]string{"Claim", "ClaimStore"}},
		{"claims: a call.connected sent before its call.started was accepted may take the call to the default agent",
			earlyClaim("", ""),
			nil},
		{"claims: ... or follow the call.started to alice",
			earlyClaim("alice", "alice"),
			nil},
		{"claims: ... but the call stays whole: its call.started then at alice's agent",
			earlyClaim("", "alice"),
			[]string{"Claim", "ClaimStore"}},
		{"claims: ... and at no third agent",
			earlyClaim("bob", "bob"),
			[]string{"Claim", "ClaimStore"}},
		{"claims: alice away, her calls queued and delivered in order when she is back; bob's live call passes them",
			aliceAway(false),
			nil},
		{"claims: ... but delivered out of order",
			aliceAway(true),
			[]string{"Order"}},
		{"claims: a request queued for alice while she was away, never delivered",
			clean().claimed().send("d3", 1, 3, 3.01, 202, queued202, "").of("d3", "call.started", "c-alice", "alice"),
			[]string{"Lost2xx", "NotInStore"}},
		{"claims: bob's store holds a capture of alice's call",
			aliceClaims("alice").capture("p4b", "d4", 4.006, "delivered", 200, "p4").seat("d4", "alice").seatCapture("p4b", "bob"),
			[]string{"ClaimStore"}},
		{"a capture still pending after the drain",
			clean().send("d3", 1, 3, 0, 0, "", "").capture("p3", "d3", 3.005, "pending", 0, ""),
			[]string{"NothingPending"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := Check(&tc.h.h)
			var got []string
			for _, v := range r.Violations {
				got = append(got, v.Rule)
				if v.DeliveryID == "" || v.Message == "" || v.At == 0 || v.Kind == "" {
					t.Errorf("incomplete violation %+v", v)
				}
			}
			got = slices.Compact(slices.Sorted(slices.Values(got)))
			if !slices.Equal(got, tc.want) {
				t.Errorf("rules fired %v, want %v; violations:\n%s", got, tc.want, list(r.Violations))
			}
			if r.OK() != (len(tc.want) == 0) {
				t.Errorf("OK() = %v with %d violations", r.OK(), len(r.Violations))
			}
		})
	}
}

func list(vs []Violation) string {
	var b strings.Builder
	for _, v := range vs {
		fmt.Fprintf(&b, "  %s/%s %s: %s\n", v.Kind, v.Rule, v.DeliveryID, v.Message)
	}
	return b.String()
}

// TestEveryRuleHasACase: each rule in rules is named by some row of
// TestCheck, so that no rule goes untested.
// and the report explains each.
func TestEveryRuleHasACase(t *testing.T) {
	// The names TestCheck expects, kept by hand beside it.
	tested := []string{"Lost2xx", "NotInStore", "Invented2xx", "UndocumentedRefusal", "DeliveredAfterRefusal",
		"RefusedAfterDelivery", "StoreOutcome", "StoreStatus", "Order", "ExtraCopy", "DuplicateMarked",
		"NothingPending", "Route", "Claim", "ClaimStore"}
	if len(tested) != len(rules) {
		t.Fatalf("%d rules, %d tested by name: add a case to TestCheck", len(rules), len(tested))
	}
	if len(ruleDocs) != len(rules) {
		t.Fatalf("%d rules, %d explained in ruleDocs", len(rules), len(ruleDocs))
	}
	for i, d := range ruleDocs {
		if d.Rule != tested[i] {
			t.Errorf("ruleDocs[%d] is %s, want %s", i, d.Rule, tested[i])
		}
	}
}

// TestCheckIsPure: checking twice gives the same result and leaves the
// history as it was.
func TestCheckIsPure(t *testing.T) {
	r := clean().send("d3", 1, 3, 3.1, 502, agentLost, "").copy("d9", 3, 1)
	before := fmt.Sprintf("%+v", r.h)
	a, b := Check(&r.h), Check(&r.h)
	if fmt.Sprintf("%+v", a) != fmt.Sprintf("%+v", b) {
		t.Fatal("two checks of one history differ")
	}
	if fmt.Sprintf("%+v", r.h) != before {
		t.Fatal("Check changed the history")
	}
}

// TestVerdict: the one line the terminal prints.
func TestVerdict(t *testing.T) {
	r := newRun()
	r.h.Meta.Seed, r.h.Meta.Mode, r.h.Meta.Minutes = 42, history.ModeTeam, 30
	for i := range 1234 {
		r.ok(fmt.Sprint("d", i), 1, 1, 1.01, 1.02, 1).capture(fmt.Sprint("p", i), fmt.Sprint("d", i), 1.005, "delivered", 200, "")
	}
	r.fault(history.FaultSigkill, "agent", 5, 6)
	if got, want := Check(&r.h).Verdict(), "chaos: PASS — 0 violations in 1,234 requests, 1 fault (seed 42, team, 30 min)"; got != want {
		t.Errorf("verdict %q, want %q", got, want)
	}
	r.send("x", 1, 3, 3.1, 302, "", "")
	r.send("y", 1, 3, 3.1, 302, "", "")
	if got, want := Check(&r.h).Verdict(), "chaos: FAIL — 2 violations (2 invented-answer) in 1,236 requests, 1 fault (seed 42, team, 30 min)"; got != want {
		t.Errorf("verdict %q, want %q", got, want)
	}
}

// seatCapture puts capture id in claimant seat's store.
func (r *run) seatCapture(id, seat string) *run {
	for i, c := range r.h.Store {
		if c.CaptureID == id {
			r.h.Store[i].Seat = seat
		}
	}
	return r
}
