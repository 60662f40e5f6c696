package main

import (
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/calltap/calltap/inspector/routes"
)

// TestCostRoutesTakeTheLoad: the cost part's route file has ten routes,
// the load's requests miss the first nine, so that each is tried against
// all ten, and the tenth takes them to the bench's handler.
func TestCostRoutesTakeTheLoad(t *testing.T) {
	const hurl = "http://127.0.0.1:4321"
	ct := &calltap{relayURL: "http://127.0.0.1:8080", tunnelPath: "/t/k3y"}
	_, spec := costSpecs(ct, hurl, 1, time.Second, time.Second)
	req := routes.Request{Body: spec.Body, Path: strings.TrimPrefix(spec.Path, ct.tunnelPath),
		Header: http.Header{"Content-Type": {spec.ContentType}, "User-Agent": {"calltap-bench"}}}

	file := costRoutes(hurl)
	if n := strings.Count(file, "[[route]]"); n != routeCount {
		t.Fatalf("%d routes, want %d:\n%s", n, routeCount, file)
	}
	tb, err := routes.Parse("routes.toml", []byte(file), routes.WithCallValues(routes.NewMemory()))
	if err != nil {
		t.Fatalf("%v\n%s", err, file)
	}
	// Twice: the second time the call's fields are remembered.
	for range 2 {
		d := tb.Match(req)
		if d.Name() != "lead1001" || d.Route.ForwardTo.String() != hurl+"/webhooks" {
			t.Fatalf("the load's request went to %s (%v), want lead1001 to %s/webhooks", d.Name(), d.Route, hurl)
		}
	}
	nine, err := routes.Parse("nine.toml", []byte(otherRoutes()), routes.WithCallValues(routes.NewMemory()))
	if err != nil {
		t.Fatal(err)
	}
	if d := nine.Match(req); d.Name() != routes.DefaultName {
		t.Errorf("route %s of the nine took the load's request; each should miss it", d.Name())
	}
}

// TestBenchRoutesStillTen: routes check's file kept its ten routes when
// its first nine became otherRoutes.
func TestBenchRoutesStillTen(t *testing.T) {
	file := benchRoutes()
	if n := strings.Count(file, "[[route]]"); n != routeCount {
		t.Fatalf("%d routes, want %d", n, routeCount)
	}
	if _, err := routes.Parse("routes.toml", []byte(file)); err != nil {
		t.Fatal(err)
	}
}

func TestRoutesFormRows(t *testing.T) {
	// The agent: CPU +8% but system calls +12%: not met. The relay moved
	// +30%: it is a control, never held.
	cell := &abCell{sync: "normal", conns: 1,
		before: measures(
			map[string][2]float64{"relay": {100, 10}, "agent": {200, 25}, "handler": {50, 4}},
			map[string][2]float64{"relay": {100, 10}, "agent": {200, 25}, "handler": {50, 4}},
		),
		after: measures(
			map[string][2]float64{"relay": {130, 10}, "agent": {216, 28}, "handler": {50, 4}},
			map[string][2]float64{"relay": {130, 10}, "agent": {216, 28}, "handler": {50, 4}},
		),
	}
	rows := routesForm("10 routes", benchFileIs, "bin/calltap-prof").rows([]*abCell{cell})
	if len(rows) != 5 || !rows[0].Head || rows[4].Note == "" {
		t.Fatalf("want a head, three processes and a note; got %+v", rows)
	}
	for _, x := range rows {
		if x.Table != "Cost per 2 KB request: 10 routes ÷ none" {
			t.Errorf("table %q", x.Table)
		}
	}
	if want := []string{"Setup", "Load", "Process", "CPU none", "CPU 10 routes", "CPU 10 routes÷none",
		"System calls none", "System calls 10 routes", "System calls 10 routes÷none"}; !slices.Equal(rows[0].Cells, want) {
		t.Errorf("head %q, want %q", rows[0].Cells, want)
	}
	for _, w := range []string{"bin/calltap-prof", "2 interleaved rounds", "(10 routes, none; none, 10 routes; …)", "within +10%"} {
		if !strings.Contains(rows[4].Note, w) {
			t.Errorf("the note lacks %q: %s", w, rows[4].Note)
		}
	}
	checkProcRows(t, rows[1:4], map[string]procRow{
		"relay":   {[]string{"--sync normal", "c=1", "relay", "100 µs", "130 µs", "+30.0%", "10.0", "10.0", "+0.0%"}, "none: the control", ""},
		"agent":   {[]string{"--sync normal", "c=1", "agent", "200 µs", "216 µs", "+8.0%", "25.0", "28.0", "+12.0%"}, "≤ +10%", "**not met**"},
		"handler": {[]string{"--sync normal", "c=1", "handler", "50 µs", "50 µs", "+0.0%", "4.0", "4.0", "+0.0%"}, "none: the control", ""},
	})
}

func TestParseCostFlags(t *testing.T) {
	o, err := parseCostFlags([]string{"--routes", "r.toml"})
	if err != nil {
		t.Fatal(err)
	}
	if !filepath.IsAbs(o.routes) || filepath.Base(o.routes) != "r.toml" {
		t.Errorf("--routes r.toml: %q, want it absolute (the agent runs elsewhere)", o.routes)
	}
	if got := o.agentArgs(); !slices.Equal(got, []string{"--routes", o.routes}) {
		t.Errorf("agent flags %q", got)
	}
	if o, _ := parseCostFlags(nil); o.agentArgs() != nil {
		t.Errorf("no --routes: agent flags %q", o.agentArgs())
	}
	if o, err := parseCostFlags([]string{"--routes-ab", "--rounds", "2"}); err != nil || !o.routesAB || o.rounds != 2 {
		t.Errorf("--routes-ab --rounds 2: %+v, %v", o, err)
	}
	for _, bad := range [][]string{
		{"--routes-ab", "--baseline", "bin/old"},
		{"--routes-ab", "--perf"},
		{"--routes-ab", "--rounds", "0"},
		{"--routes-ab", "--label", "x"},
		{"--baseline", "bin/old", "--perf"},
	} {
		if _, err := parseCostFlags(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}
