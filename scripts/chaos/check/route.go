package check

import (
	"path"
	"slices"
	"strings"

	"github.com/calltap/calltap/scripts/chaos/history"
)

// router works out which handler servers may rightly get each copy, from
// the routes the run's meta lists and what the senders recorded (each
// event's kind and the developer its body named). It is the checker's own
// reading of a route file's rules, not calltap's: the first route that
// takes a request wins, the rest goes to the default.
type router struct {
	ix    *index
	named map[string][]string // call id -> its deliveries whose bodies name a developer, by first send
}

func newRouter(ix *index) *router {
	r := &router{ix: ix, named: map[string][]string{}}
	for _, d := range ix.order { // by first send
		if s := ix.h.Sends[ix.sends[d][0]]; s.Developer != "" {
			r.named[s.CallID] = append(r.named[s.CallID], d)
		}
	}
	return r
}

// take is a route's answer for one copy.
type take int

const (
	takesNot take = iota
	takes
	// mayTake: the route takes the request only if the agent had seen the
	// event that named the call's developer when it decided, which the
	// history cannot tell (that event was not yet accepted).
	mayTake
)

// routesFor lists the routes whose servers may rightly get copy ci of d:
// the first route that takes it, after the routes that may.
func (r *router) routesFor(d string, ci int) []string {
	var may []string
	for _, rt := range r.ix.h.Meta.Routes {
		switch r.takes(rt, d, ci) {
		case takes:
			return append(may, rt.Name)
		case mayTake:
			may = append(may, rt.Name)
		}
	}
	return append(may, history.DefaultRoute)
}

// takes says whether route rt takes copy ci of d: its event kind is one of
// the route's, and its developer, when the route names one, is the
// route's. A body that names no developer has the one its call's events
// last named, as the agent had seen them when it decided (recalled): a
// call stays together.
func (r *router) takes(rt history.Route, d string, ci int) take {
	s := r.ix.h.Sends[r.ix.sends[d][0]]
	if len(rt.Events) > 0 && !slices.ContainsFunc(rt.Events, func(g string) bool { ok, _ := path.Match(g, s.Event); return ok }) {
		return takesNot
	}
	if rt.Developer == "" || s.Developer == rt.Developer {
		return takes
	}
	if s.Developer != "" {
		return takesNot
	}
	devs, sure := r.recalled(d, ci)
	switch {
	case !slices.Contains(devs, rt.Developer):
		return takesNot
	case sure && len(devs) == 1:
		return takes
	}
	return mayTake
}

// recalled is the developer the agent may have recalled for copy ci of d,
// whose body names none: the one its call's events last named, of those
// the agent had seen when it decided. Of the call's events that name one,
// it surely saw those accepted before the copy's send (knownBefore), and
// may have seen the others sent before the copy arrived; of the sure ones
// the last is known when each other was accepted before it was sent (the
// order promise). devs are the developers it may have recalled; sure,
// whether it surely recalled one.
func (r *router) recalled(d string, ci int) (devs []string, sure bool) {
	arrived := r.ix.h.Handler[ci].ReceivedAt
	var surely, maybe []string
	for _, c := range r.named[r.ix.h.Sends[r.ix.sends[d][0]].CallID] {
		switch {
		case r.knownBefore(c, d, ci):
			surely = append(surely, c)
		case r.ix.h.Sends[r.ix.sends[c][0]].SentAt <= arrived:
			maybe = append(maybe, c)
		}
	}
	if last, ok := r.lastSeen(surely); ok {
		surely = []string{last}
	}
	for _, c := range append(surely, maybe...) {
		if dev := r.ix.h.Sends[r.ix.sends[c][0]].Developer; !slices.Contains(devs, dev) {
			devs = append(devs, dev)
		}
	}
	return devs, len(surely) > 0
}

// lastSeen finds, among deliveries cs the agent saw, the one it saw last:
// each other was accepted before it was sent.
func (r *router) lastSeen(cs []string) (string, bool) {
	for _, l := range cs {
		sent := r.ix.h.Sends[r.ix.sends[l][0]].SentAt
		if !slices.ContainsFunc(cs, func(c string) bool {
			a := r.ix.accepted(c)
			return c != l && (a < 0 || r.ix.h.Sends[a].AnsweredAt >= sent)
		}) {
			return l, true
		}
	}
	return "", false
}

// knownBefore reports whether the agent had surely seen delivery carrier
// before it decided where copy ci of d goes: carrier was accepted (a 2xx,
// or a queued 202, which the order promise hands the agent first) before
// the earliest send of d that could have brought the copy was sent.
func (r *router) knownBefore(carrier, d string, ci int) bool {
	a := r.ix.accepted(carrier)
	sent, ok := r.ix.firstCause(d, ci)
	return a >= 0 && ok && r.ix.h.Sends[a].AnsweredAt < sent
}

// ruleRoute — routes: with a route file (meta's routes, the default
// agent's), each copy of a delivery at the default agent reached the
// server of a route that takes it (routesFor), and no other: media by event kind, alice by the developer its body or, when
// it names none, its call's call.started named, the rest the default. A
// later event of alice's call sent before the call.started was accepted
// may go to either, since the agent may not have seen it yet. One
// violation per delivery, at its first copy at a wrong server.
func ruleRoute(ix *index) []Violation {
	if len(ix.h.Meta.Routes) == 0 {
		return nil // a run without a route file
	}
	r := newRouter(ix)
	var out []Violation
	for _, d := range ix.order {
		for _, ci := range ix.copies[d] {
			c := ix.h.Handler[ci]
			if c.Seat != defaultSeat {
				continue // a claimant's agent has no route file; ruleClaim judges it
			}
			want := r.routesFor(d, ci)
			if slices.Contains(want, c.Route) {
				continue
			}
			out = append(out, ix.violation(KindRoute, "Route", d, c.ReceivedAt,
				"%s reached the %q handler at %s; it belongs to %s", r.describe(d), c.Route, ix.rel(c.ReceivedAt),
				strings.Join(want, " or ")))
			break
		}
	}
	return out
}

// describe names d's event and call and the developers its call's events
// named, in the order sent: "call.ended of call c1 (its call's events
// name developer alice (d7), bob (d9))".
func (r *router) describe(d string) string {
	what, named := r.ix.describeEvent(d)
	if named {
		return what
	}
	var names []string
	for _, c := range r.named[r.ix.h.Sends[r.ix.sends[d][0]].CallID] {
		names = append(names, r.ix.h.Sends[r.ix.sends[c][0]].Developer+" ("+c+")")
	}
	if len(names) == 0 {
		return what + " (no developer)"
	}
	return what + " (its call's events name developer " + strings.Join(names, ", ") + ")"
}
