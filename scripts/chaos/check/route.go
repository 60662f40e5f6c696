package check

import (
	"path"
	"slices"
	"strings"

	"github.com/calltap/calltap/scripts/chaos/history"
)

// callDeveloper is the developer a call named, and the delivery whose body
// named it first.
type callDeveloper struct{ name, d string }

// router works out which handler servers may rightly get each copy, from
// the routes the run's meta lists and what the senders recorded (each
// event's kind and the developer its body named). It is the checker's own
// reading of a route file's rules, not calltap's: the first route that
// takes a request wins, the rest goes to the default.
type router struct {
	ix   *index
	devs map[string]callDeveloper // call id -> its developer
}

func newRouter(ix *index) *router {
	r := &router{ix: ix, devs: map[string]callDeveloper{}}
	for _, d := range ix.order { // by first send
		s := ix.h.Sends[ix.sends[d][0]]
		if _, ok := r.devs[s.CallID]; !ok && s.Developer != "" {
			r.devs[s.CallID] = callDeveloper{name: s.Developer, d: d}
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
// route's. A body that names no developer has its call's, once the agent
// has surely seen the event that named it (knownBefore): a call stays
// together.
func (r *router) takes(rt history.Route, d string, ci int) take {
	s := r.ix.h.Sends[r.ix.sends[d][0]]
	if len(rt.Events) > 0 && !slices.ContainsFunc(rt.Events, func(g string) bool { ok, _ := path.Match(g, s.Event); return ok }) {
		return takesNot
	}
	if rt.Developer == "" || s.Developer == rt.Developer {
		return takes
	}
	cd, ok := r.devs[s.CallID]
	switch {
	case s.Developer != "" || !ok || cd.name != rt.Developer:
		return takesNot
	case r.knownBefore(cd.d, d, ci):
		return takes
	}
	return mayTake
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

// describe names d's event and call and the developer that decides its
// route: "call.ended of call c1 (its call's developer alice, named by
// d7)".
func (r *router) describe(d string) string {
	what, named := r.ix.describeEvent(d)
	if named {
		return what
	}
	if cd, ok := r.devs[r.ix.h.Sends[r.ix.sends[d][0]].CallID]; ok {
		return what + " (its call's developer " + cd.name + ", named by " + cd.d + ")"
	}
	return what + " (no developer)"
}
