package web_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/google/uuid"

	"github.com/calltap/calltap/inspector/routes"
	"github.com/calltap/calltap/storage/agentdb"
)

// routeShown says whether the requests list shows its Route column: the
// header and the cell of the row of capture id.
func routeShown(id string) string {
	return `getComputedStyle(document.querySelector('[data-view=requests] .lhead .h-route')).display !== 'none' && ` +
		`getComputedStyle(` + rowFor(id) + `.querySelector('.c-route')).display !== 'none'`
}

// routeCell is the text of the Route cell of capture id's row.
func routeCell(id string) string {
	return rowFor(id) + `.querySelector('.c-route').textContent`
}

// The list shows a Route column once a capture has a route, live, and not
// before (a user without a route file sees the list as it was); a stored
// capture reads "stored only" with its route, never as a failure or as
// pending; the detail names the route; the filter bar filters by route,
// kept in the URL, and a route's cell filters to it. A route is text,
// whatever it holds.
func TestBrowserRoutes(t *testing.T) {
	browser := startBrowser(t)
	s := startStack(t)
	tb := newTab(t, browser, s.InspectorURL)
	plain := s.sendStarted(t)
	tb.open("/")
	tb.waitFor("the capture", rowFor(plain))
	if tb.str(`String(`+routeShown(plain)+`)`) != "false" {
		t.Errorf("the Route column shows with no capture routed")
	}

	// A route file from now on: the captures it routes come in live,
	// and the column shows without a reload.
	// quiet first: the first route that matches wins.
	table, err := routes.Parse("routes.toml", []byte(`[[route]]
name = "quiet"
events = ["call.connected"]
store-only = true
[[route]]
name = "alice"
match = { "call.variables.lead_id" = "EZ-1042" }
forward-to = "`+s.h.srv.URL+`/alice"`))
	if err != nil {
		t.Fatal(err)
	}
	s.Agent.SetRoutes(table)
	callID := uuid.NewString()
	for _, kind := range []string{"call.started", "call.connected"} {
		if code := s.send(t, "/hook", event(kind, callID, time.Now(), nil)); code != 200 {
			t.Fatalf("sender got %d for %s", code, kind)
		}
	}
	var alice, quiet string
	for _, c := range s.captures(t) {
		switch {
		case c.CallID == callID && c.Event == "call.started":
			alice = c.ID
		case c.CallID == callID && c.Event == "call.connected":
			quiet = c.ID
		}
	}
	tb.waitFor("the routed captures, live", rowFor(alice)+` && `+rowFor(quiet)+` && `+routeShown(plain))

	// A route name is the user's text: one no route file allows, saved
	// straight into the store, is shown as text all the same.
	hostile := `<img src=x onerror=window.__pwned=4;alert(4)>`
	c := &agentdb.Capture{ID: uuid.NewString(), Source: "tunnel", CreatedAt: time.Now().UTC(), Method: "POST", Path: "/hook", RequestHeaders: `[]`,
		Body: event("call.connected", uuid.NewString(), time.Now(), nil), Route: hostile, Status: agentdb.StatusStored, Duration: -1}
	if _, err := s.AgentDB.WriteCaptures(context.Background(), []*agentdb.Capture{c}, nil); err != nil {
		t.Fatal(err)
	}
	evil := c.ID

	tb.open("/")
	tb.waitFor("every row", rowFor(plain)+` && `+rowFor(alice)+` && `+rowFor(quiet)+` && `+rowFor(evil))
	tb.waitFor("the Route column", routeShown(plain))
	for id, want := range map[string]string{alice: "alice", quiet: "quiet", evil: hostile, plain: ""} {
		if got := tb.str(routeCell(id)); got != want {
			t.Errorf("the Route cell of %s reads %q, want %q", id, got, want)
		}
	}
	if got := tb.str(rowFor(alice) + `.querySelector('.c-status').textContent`); got != "200" {
		t.Errorf("the delivered capture's status reads %q, want 200", got)
	}
	if got := tb.str(flagsOfRow(quiet)); got != "stored only" {
		t.Errorf("the stored capture's flags read %q, want stored only", got)
	}
	if got := tb.str(rowFor(quiet) + `.querySelector('.c-status').textContent`); got != "stored" {
		t.Errorf("the stored capture's status reads %q, want stored", got)
	}
	if n := tb.str(`String(` + rowFor(quiet) + `.querySelectorAll('.s5, .pending, .f-failed').length)`); n != "0" {
		t.Errorf("the stored capture is shown as failed or pending (%s marks)", n)
	}
	if got := tb.str(rowFor(quiet) + `.querySelector('.f-stored').title`); !strings.Contains(got, "route quiet") {
		t.Errorf("the stored-only mark says %q, without its route", got)
	}
	tb.shot("route-column")

	// The detail: the route in the summary line, in General, and a
	// response tab that says stored only, with the route.
	tb.open("/requests/" + quiet)
	tb.waitFor("the route in the summary", `document.querySelector('.detail-pane .d-meta .d-route')?.textContent === 'route quiet'`)
	if got := tb.str(`[...document.querySelectorAll('.detail-pane .kv dt')].find(e => e.textContent === 'Route')?.nextElementSibling.textContent`); got != "quiet" {
		t.Errorf("General's Route reads %q, want quiet", got)
	}
	tb.click(`.detail-pane .tab[data-tab=response]`)
	tb.waitFor("the stored-only answer", `document.querySelector('.detail-pane .tab-response')?.textContent.includes('stored only')`)
	if got := tb.str(`document.querySelector('.detail-pane .tab-response').textContent`); !strings.Contains(got, "route quiet") || strings.Contains(got, "Waiting") || strings.Contains(got, "no response") {
		t.Errorf("the response tab of a stored capture reads %q", got)
	}
	tb.shot("route-detail")
	tb.click(`.detail-pane .tab[data-tab=request]`)

	// The filter bar's route filter, kept in the URL and over a reload.
	tb.open("/")
	tb.waitFor("every row", visibleRows+`.length === 4`)
	setRoute := func(v string) {
		tb.js(fmt.Sprintf(`(i => { i.value = %s; i.dispatchEvent(new Event('change')); })(document.querySelector('.filters .f-route'))`, strconv.Quote(v)))
	}
	setRoute("alice")
	only := func(id, route string) {
		t.Helper()
		tb.waitFor("the list of route "+route, visibleRows+`.length === 1 && !!`+rowFor(id)+` && new URLSearchParams(location.search).get('route') === `+strconv.Quote(route))
	}
	only(alice, "alice")
	tb.do(chromedp.Reload())
	tb.waitFor("the app to restart", `!!document.querySelector('.topbar .status .state')`)
	only(alice, "alice")
	if got := tb.str(`document.querySelector('.filters .f-route').value`); got != "alice" {
		t.Errorf("after a reload the route filter shows %q", got)
	}
	tb.shot("route-filter")
	tb.click(`.filters .f-clear`)
	tb.waitFor("the whole list back", visibleRows+`.length === 4 && location.search === ''`)
	// A route's cell filters to it.
	tb.click(fmt.Sprintf(`[data-view=requests] .vrow[data-key=%q] .routepill`, quiet))
	only(quiet, "quiet")
	tb.click(`.filters .f-clear`)
	tb.waitFor("the whole list back", visibleRows+`.length === 4 && location.search === ''`)
	setRoute(hostile)
	only(evil, hostile)

	if n := tb.str(`String(document.querySelectorAll('#app img:not(.brand img), #app [onerror]').length)`); n != "0" {
		t.Errorf("%s elements were made from a route name", n)
	}
	if got := tb.str(`String(window.__pwned)`); got != "undefined" {
		t.Errorf("a route name ran code: window.__pwned = %s", got)
	}
	if n := tb.dialogs.Load(); n != 0 {
		t.Errorf("%d dialogs opened", n)
	}
}
