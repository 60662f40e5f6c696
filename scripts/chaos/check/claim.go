package check

import "strings"

// ruleClaim — claims: with claimant agents (meta's claimants), every copy
// of a delivery reached the handler of its call's seat (see newSeats: the
// claimant its first event's developer names, or the default agent when
// nobody claims it) and no other agent's, whatever a later event of the
// call names. One violation per delivery, at its first copy at a wrong
// agent.
func ruleClaim(ix *index) []Violation {
	if len(ix.h.Meta.Claimants) == 0 {
		return nil
	}
	s := newSeats(ix)
	var out []Violation
	for _, d := range ix.order {
		cs := s.of(d)
		for _, ci := range ix.copies[d] {
			c := ix.h.Handler[ci]
			if c.Seat == cs.seat {
				continue
			}
			out = append(out, ix.violation(KindClaim, "Claim", d, c.ReceivedAt,
				"%s reached %s's handler at %s; its call belongs to %s", s.describe(d), seatName(c.Seat), ix.rel(c.ReceivedAt), s.belongs(cs)))
			break
		}
	}
	return out
}

// ruleClaimStore — claims, in the stores: each agent's store holds only
// its own seat's calls. A capture in another agent's store than its call's
// seat's (see ruleClaim) breaks it: one developer's inspector shows
// another's call.
func ruleClaimStore(ix *index) []Violation {
	if len(ix.h.Meta.Claimants) == 0 {
		return nil
	}
	s := newSeats(ix)
	var out []Violation
	for _, c := range ix.h.Store {
		if _, sent := ix.sends[c.DeliveryID]; !sent {
			continue // ruleDeliveredAfterRefusal reports a request nobody sent
		}
		cs := s.of(c.DeliveryID)
		if c.Seat == cs.seat {
			continue
		}
		out = append(out, ix.violation(KindClaim, "ClaimStore", c.DeliveryID, c.ReceivedAt,
			"capture %s (%s) is in %s's store; its call belongs to %s", c.CaptureID, s.describe(c.DeliveryID), seatName(c.Seat), s.belongs(cs)))
	}
	return out
}

// describe names d's event and call: "call.ended of call c1 (naming
// developer bob)".
func (s *seats) describe(d string) string {
	what, _ := s.ix.describeEvent(d)
	return what
}

// belongs says where a call belongs and why: "alice's agent (its first
// event d3 names developer alice)"; or, when the history leaves more than
// one seat open, the one it went to first among them.
func (s *seats) belongs(cs *callSeat) string {
	named := "names no developer"
	if cs.developer != "" {
		named = "names developer " + cs.developer
	}
	if len(cs.allowed) < 2 {
		return seatName(cs.seat) + " (its first event " + cs.first + " " + named + ")"
	}
	names := make([]string, len(cs.allowed))
	for i, a := range cs.allowed {
		names[i] = seatName(a)
	}
	return seatName(cs.seat) + ", where it went first (its first event " + cs.first + " " + named +
		", but events sent before any of the call was accepted could have given it to " + strings.Join(names, " or ") + ")"
}
