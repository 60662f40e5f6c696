package check

import (
	"slices"
	"strings"

	"github.com/calltap/calltap/scripts/chaos/history"
)

// defaultSeat is the seat of the token's default agent: the one that
// claims nothing and gets what no claimant claims.
const defaultSeat = ""

// callSeat is where a call belongs: the seat of the event the relay
// routed first, which the history narrows to allowed.
type callSeat struct {
	// allowed are the seats of the call's events that may have reached a
	// relay before any other (see newSeats), sorted.
	allowed []string
	// seat is the one the call is judged to be with: the only allowed
	// seat, else the allowed seat its first copy (or first capture)
	// reached, else its first event's.
	seat string
	// first is the call's first event (lowest seq) and the developer it
	// named, for messages.
	first, developer string
}

// seats works out which agent each call belongs to, from the claimants
// the run's meta lists and what the senders recorded: a call stays with
// the seat its first event went to. It is the checker's own reading of
// claims, not calltap's.
type seats struct {
	ix    *index
	byDev map[string]string    // developer -> the claimant that claims it
	calls map[string]*callSeat // call id -> where it belongs
}

// newSeats judges each call's seat. The relay decides a call's seat when
// it routes the call's first event to reach it, which is not always the
// call.started: an event sent while the call.started was still being
// retried may come first, and a later event may name another developer.
// The event a relay accepted first was routed by its answer, so the
// first one routed was sent before that: every event of the call sent
// before the call's first acceptance may have decided its seat.
func newSeats(ix *index) *seats {
	s := &seats{ix: ix, byDev: map[string]string{}, calls: map[string]*callSeat{}}
	for _, c := range ix.h.Meta.Claimants {
		s.byDev[c.Developer] = c.Name
	}
	events := map[string][]string{} // call id -> its deliveries, by first send
	for _, d := range ix.order {
		call := ix.h.Sends[ix.sends[d][0]].CallID
		events[call] = append(events[call], d)
	}
	for call, ds := range events {
		s.calls[call] = s.judge(ds)
	}
	return s
}

// seatOf is the seat a call whose deciding event named developer dev
// belongs to.
func (s *seats) seatOf(dev string) string { return s.byDev[dev] }

// judge works out the seat of the call made of deliveries ds.
func (s *seats) judge(ds []string) *callSeat {
	ix := s.ix
	firstAccept := int64(-1)
	for _, d := range ds {
		if a := ix.accepted(d); a >= 0 && (firstAccept < 0 || ix.h.Sends[a].AnsweredAt < firstAccept) {
			firstAccept = ix.h.Sends[a].AnsweredAt
		}
	}
	cs := &callSeat{}
	lowest := -1
	for _, d := range ds {
		first := ix.h.Sends[ix.sends[d][0]]
		if firstAccept >= 0 && first.SentAt > firstAccept {
			continue
		}
		if seat := s.seatOf(first.Developer); !slices.Contains(cs.allowed, seat) {
			cs.allowed = append(cs.allowed, seat)
		}
		if lowest < 0 || first.Seq < lowest {
			lowest, cs.first, cs.developer = first.Seq, d, first.Developer
		}
	}
	slices.Sort(cs.allowed)
	cs.seat = s.seatOf(cs.developer)
	if len(cs.allowed) > 1 {
		if seat, ok := s.firstLanding(ds, cs.allowed); ok {
			cs.seat = seat
		}
	}
	return cs
}

// firstLanding is the allowed seat the call's first copy reached (by the
// handler's order), or, with no copy, its first capture's.
func (s *seats) firstLanding(ds []string, allowed []string) (string, bool) {
	ix := s.ix
	pos := -1
	for _, d := range ds {
		for _, ci := range ix.copies[d] {
			if slices.Contains(allowed, ix.h.Handler[ci].Seat) && (pos < 0 || ci < pos) {
				pos = ci
			}
		}
	}
	if pos >= 0 {
		return ix.h.Handler[pos].Seat, true
	}
	best := -1
	for _, d := range ds {
		for _, p := range ix.captures[d] {
			if slices.Contains(allowed, ix.h.Store[p].Seat) && (best < 0 || ix.h.Store[p].ReceivedAt < ix.h.Store[best].ReceivedAt) {
				best = p
			}
		}
	}
	if best >= 0 {
		return ix.h.Store[best].Seat, true
	}
	return "", false
}

// of is where delivery d's call belongs.
func (s *seats) of(d string) *callSeat {
	return s.calls[s.ix.h.Sends[s.ix.sends[d][0]].CallID]
}

// seatName is a seat as messages and the report name it.
func seatName(seat string) string {
	if seat == defaultSeat {
		return "the default agent"
	}
	return seat + "'s agent"
}

// faultSeat is the seat whose traffic a fault on target bears on, in a run
// with claimants: the agent's, for a fault of an agent or of its links
// ("agent", "agent-alice", "agent-bob->relay-1"); false for the rest
// (relay nodes, NATS servers), which bear on every seat.
func faultSeat(target string, claimants []history.Claimant) (string, bool) {
	proc, _, _ := strings.Cut(target, "->")
	if proc == "agent" {
		return defaultSeat, true
	}
	for _, c := range claimants {
		if proc == history.ClaimantProc(c.Name) {
			return c.Name, true
		}
	}
	return "", false
}
