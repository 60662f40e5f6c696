package agent

import (
	"encoding/json"
	"net/http"
	"net/url"

	"github.com/calltap/calltap/inspector/routes"
	"github.com/calltap/calltap/relay/wire"
	"github.com/calltap/calltap/storage/agentdb"
)

// Where a capture goes. Without a route file every capture goes to
// --forward-to, and records no route. With one (inspector/routes), the
// first route that takes the request decides: its forward-to, or stored
// only; a request no route takes goes to --forward-to (route "default"),
// or is stored only when there is none; one the event filter leaves out
// is stored only (route "filtered"). The route is recorded on the capture:
// its turn line is the route's (turns.go), and a replay follows it.

// StoredOnlyHeader is the header of the answer the agent gives, itself, to
// a request it stores only: its value is the route that said so.
const StoredOnlyHeader = "Calltap-Stored-Only"

// SetRoutes makes t the route table from now on (a reload of the route
// file); requests already captured keep the route they took.
func (a *Agent) SetRoutes(t *routes.Table) { a.routes.Store(t) }

// Routes is the route table in use; nil without one.
func (a *Agent) Routes() *routes.Table { return a.routes.Load() }

// route decides where c goes and sets its route and target; a capture
// sent nowhere gets StatusStored.
func (a *Agent) route(c *agentdb.Capture, h wire.Header) {
	t := a.routes.Load()
	if t == nil {
		a.setTarget(c, a.forwardTo)
		return
	}
	req := routes.Request{Body: c.Body, Path: c.Path, Event: c.Event}
	if t.UsesHeaders() {
		req.Header = http.Header{}
		h.Apply(req.Header)
	}
	d := t.Match(req)
	c.Route = d.Name()
	switch {
	case d.Route != nil && d.Route.ForwardTo != nil:
		a.setTarget(c, d.Route.ForwardTo)
	case d.Route == nil && !d.Filtered && a.forwardTo != nil:
		a.setTarget(c, a.forwardTo)
	default:
		c.Status = agentdb.StatusStored
	}
}

// setTarget appends c's path and query to base; a path that could lead
// out of base is refused, recorded on c, and not sent.
func (a *Agent) setTarget(c *agentdb.Capture, base *url.URL) {
	if base == nil {
		return
	}
	if c.Target = joinTarget(base, c.Path, c.Query); c.Target == "" {
		c.Error = errOutsideBase
	}
}

// routeBase is where the route named name sends now: its forward-to in
// the table in use, --forward-to for the default (and for captures that
// took no route); nil when it stores only or the file has it no more.
func (a *Agent) routeBase(name string) *url.URL {
	t := a.routes.Load()
	switch {
	case name == "" || name == routes.DefaultName:
		return a.forwardTo
	case t == nil:
		return nil
	}
	if r := t.Route(name); r != nil {
		return r.ForwardTo
	}
	return nil
}

// retarget gives a saved capture with no target (an earlier run had no
// handler for it) its route's target now.
func (a *Agent) retarget(c *agentdb.Capture) {
	if base := a.routeBase(c.Route); base != nil {
		a.setTarget(c, base)
	}
}

// followRoute sends replay c where its original went: along the route
// the original took, as the route file says now. An original that took
// no route keeps what route chose for c. A replay is always sent: it is
// never stored only.
func (a *Agent) followRoute(c, orig *agentdb.Capture) {
	c.Status = agentdb.StatusPending
	if orig.Route == "" {
		return
	}
	c.Route, c.Target, c.Error = orig.Route, "", ""
	if base := a.routeBase(orig.Route); base != nil {
		a.setTarget(c, base)
	}
}

// answerStored answers a live request its route stores only, once it is
// saved: 200 from the agent itself, with a header that says so, never
// passed off as a handler's answer. One whose save failed is refused, as
// any live request is, and its sender sends it again.
func (a *Agent) answerStored(x *exchange) {
	<-x.saved
	if x.err != nil {
		x.finish(refusal(x.err))
		return
	}
	a.printLine(x.c)
	x.finish(storedAnswer(x.c.Route))
}

// storedAnswer is the agent's answer to a request stored only by route.
func storedAnswer(route string) *wire.Response {
	body, _ := json.Marshal(struct {
		StoredOnly bool   `json:"stored_only"`
		Route      string `json:"route"`
	}{true, route})
	return &wire.Response{Status: http.StatusOK, Body: body, Header: wire.Header{
		{Name: "Content-Type", Value: "application/json"},
		{Name: StoredOnlyHeader, Value: route},
	}}
}
