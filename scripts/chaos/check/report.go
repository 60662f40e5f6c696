package check

import (
	"bytes"
	_ "embed"
	"fmt"
	"html/template"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/calltap/calltap/scripts/chaos/history"
)

//go:embed report.html.tmpl
var reportHTML string

var reportTmpl = template.Must(template.New("report").Parse(reportHTML))

// maxListed bounds the violations listed in the page's table; the verdict
// and the counts still say how many there were.
const maxListed = 500

type reportView struct {
	Title      string
	Verdict    string
	Pass       bool
	Facts      []row
	Counts     []row
	Chart      chartView
	Legend     []legendItem
	Overall    availRow
	ByKind     []kindRow
	Avail      []availRow
	Violations []violationRow
	More       int // violations not listed
	Rules      []ruleRow
	Routes     []routeRow // the handlers, one per route and the default's; none without a route file
	Claimants  []routeRow // the agents, one per claimant and the default one; none without claimants
	AnswerMax  string
	No2xxMax   string
}

type row struct {
	Label, Value string
	Sub, Bad     bool // indented under the row above; worth a look
}

type legendItem struct{ Kind, Color string }

type availRow struct {
	N                     int
	Kind, Target, Color   string
	Calls                 string // whose calls alone the waits are of ("alice's calls"); "" for every call's
	From, Length          string
	Attempts, NoAnswer    string
	P50, P99, Max, No2xx  string
	OverAnswer, OverNo2xx bool
}

// kindRow is the worst of one kind of fault on one kind of target.
type kindRow struct {
	Kind, On, Color       string
	Faults                int
	Max, No2xx            string
	OverAnswer, OverNo2xx bool
}

type ruleRow struct {
	Kind, Rule, Says string
	Count            int
}

// routeRow is one handler server of the run and what its route takes.
type routeRow struct{ Name, Takes string }

// routeRows describes the run's handlers: each route's, in file order,
// then the default's.
func routeRows(rs []history.Route) []routeRow {
	if len(rs) == 0 {
		return nil
	}
	var rows []routeRow
	for _, r := range rs {
		var takes []string
		if len(r.Events) > 0 {
			takes = append(takes, "events "+strings.Join(r.Events, ", "))
		}
		if r.Developer != "" {
			takes = append(takes, "call.variables.developer = "+r.Developer+" (on the event, else on its call's earlier events)")
		}
		rows = append(rows, routeRow{Name: r.Name, Takes: strings.Join(takes, "; ")})
	}
	return append(rows, routeRow{Name: history.DefaultRoute, Takes: "what no route takes (--forward-to)"})
}

// claimantRows describes the run's agents: each claimant's, then the
// default one's.
func claimantRows(cs []history.Claimant) []routeRow {
	if len(cs) == 0 {
		return nil
	}
	rows := make([]routeRow, 0, len(cs)+1)
	for _, c := range cs {
		rows = append(rows, routeRow{Name: seatName(c.Name),
			Takes: "calls whose first event names call.variables.developer = " + c.Developer + " (--claim call.variables.developer=" + c.Developer + "), every later event of them"})
	}
	return append(rows, routeRow{Name: seatName(defaultSeat), Takes: "the calls nobody claims; its route file splits them among its handlers"})
}

type violationRow struct {
	Clock, Kind, Rule, DeliveryID, Tunnel, Message string
}

// WriteReport writes the page for run h, judged r, to path: one HTML file
// that needs nothing else (inline CSS and SVG, no script, no font, no link).
func WriteReport(path string, h *history.History, r Result) error {
	var buf bytes.Buffer
	if err := reportTmpl.Execute(&buf, buildView(h, r)); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	return nil
}

func buildView(h *history.History, r Result) reportView {
	tl := newTimeline(h)
	m := h.Meta
	v := reportView{
		Title:   fmt.Sprintf("chaos %s seed %d", m.Mode, m.Seed),
		Verdict: r.Verdict(), Pass: r.OK(), Chart: tl.view(r),
		AnswerMax: boundText(m.Bounds.AnswerMaxMS), No2xxMax: boundText(m.Bounds.No2xxMaxMS),
		Facts: []row{
			{Label: "seed", Value: fmt.Sprint(m.Seed)},
			{Label: "mode", Value: m.Mode},
			{Label: "minutes", Value: trimFloat(m.Minutes)},
			{Label: "started", Value: utc(m.Started)},
			{Label: "ended", Value: utc(m.Ended)},
			{Label: "store read", Value: utc(m.Drained)},
		},
		Counts:    countRows(r),
		Routes:    routeRows(m.Routes),
		Claimants: claimantRows(m.Claimants),
		Overall:   availOf(tl, 0, history.Fault{Kind: "whole run", Start: m.Started}, r.Overall),
	}
	for _, k := range slices.Sorted(maps.Keys(r.Counts.FaultsByKind)) {
		v.Legend = append(v.Legend, legendItem{Kind: k, Color: faultColor(k)})
	}
	for _, k := range r.ByKind {
		v.ByKind = append(v.ByKind, kindRow{Kind: k.Kind, On: k.On, Color: faultColor(k.Kind), Faults: k.Faults,
			Max: fmtDur(k.Max), No2xx: fmtDur(k.No2xx), OverAnswer: k.OverAnswer, OverNo2xx: k.OverNo2xx})
	}
	for i, fw := range r.PerFault {
		a := availOf(tl, i+1, fw.Fault, fw.Waits)
		if fw.Scoped {
			a.Calls = seatCalls(fw.Seat)
		}
		v.Avail = append(v.Avail, a)
	}
	byRule := map[string]int{}
	for _, vi := range r.Violations {
		byRule[vi.Rule]++
	}
	for _, d := range ruleDocs {
		v.Rules = append(v.Rules, ruleRow{Kind: d.Kind, Rule: d.Rule, Says: d.Says, Count: byRule[d.Rule]})
	}
	for i, vi := range r.Violations {
		if i == maxListed {
			v.More = len(r.Violations) - i
			break
		}
		v.Violations = append(v.Violations, violationRow{Clock: tl.clock(vi.At), Kind: vi.Kind, Rule: vi.Rule,
			DeliveryID: vi.DeliveryID, Tunnel: vi.Tunnel, Message: vi.Message})
	}
	return v
}

func countRows(r Result) []row {
	c := r.Counts
	rows := []row{
		{Label: "requests (delivery ids)", Value: thousands(c.Deliveries)},
		{Label: "accepted (2xx or 202)", Value: thousands(c.Accepted), Sub: true},
		{Label: "attempts", Value: thousands(c.Attempts)},
	}
	for _, k := range []string{"2xx", "202", "4xx", "5xx", "none", "other"} {
		if n, ok := c.ByClass[k]; ok {
			label := "answered " + k
			if k == "none" {
				label = "no answer"
			}
			rows = append(rows, row{Label: label, Value: thousands(n), Sub: true})
		}
	}
	rows = append(rows,
		row{Label: "handler copies", Value: thousands(c.HandlerCopies)},
		row{Label: "duplicates (copies after the first)", Value: thousands(c.Duplicates), Sub: true})
	for _, h := range routeRows(r.Meta.Routes) {
		rows = append(rows, row{Label: "at the " + h.Name + " handler", Value: thousands(c.ByRoute[h.Name]), Sub: true})
	}
	for _, cl := range r.Meta.Claimants {
		rows = append(rows, row{Label: "at " + seatName(cl.Name), Value: thousands(c.BySeat[cl.Name]), Sub: true})
	}
	rows = append(rows,
		row{Label: "captures in the store", Value: thousands(c.Captures)},
		row{Label: "marked duplicate_of", Value: thousands(c.CaptureDupes), Sub: true})
	for _, k := range slices.Sorted(maps.Keys(c.CaptureStates)) {
		rows = append(rows, row{Label: k, Value: thousands(c.CaptureStates[k]), Sub: true,
			Bad: k == "pending" || k == "queued"})
	}
	rows = append(rows, row{Label: "faults", Value: thousands(c.Faults)})
	for _, k := range slices.Sorted(maps.Keys(c.FaultsByKind)) {
		rows = append(rows, row{Label: k, Value: thousands(c.FaultsByKind[k]), Sub: true})
	}
	rows = append(rows, row{Label: "violations", Value: thousands(len(r.Violations)), Bad: len(r.Violations) > 0})
	for _, k := range kinds() {
		n := c.ViolationsKind[k]
		rows = append(rows, row{Label: k, Value: thousands(n), Sub: true, Bad: n > 0})
	}
	return rows
}

func availOf(tl *timeline, n int, f history.Fault, w Waits) availRow {
	a := availRow{N: n, Kind: f.Kind, Target: f.Target, Color: faultColor(f.Kind), From: tl.clock(f.Start),
		Attempts: thousands(w.Attempts), NoAnswer: thousands(w.NoAnswer), P50: fmtDur(w.P50), P99: fmtDur(w.P99), Max: fmtDur(w.Max),
		No2xx: fmtDur(w.No2xx), OverAnswer: w.OverAnswer, OverNo2xx: w.OverNo2xx}
	if f.End != 0 {
		a.Length = fmtDur(time.Duration(f.End - f.Start))
	}
	return a
}

// seatCalls names the calls of a seat, as the availability table says
// whose waits it measured.
func seatCalls(seat string) string {
	if seat == defaultSeat {
		return "the default agent's calls"
	}
	return seat + "'s calls"
}

func boundText(ms int64) string {
	if ms <= 0 {
		return "none stated"
	}
	return fmtDur(time.Duration(ms) * time.Millisecond)
}

func utc(ns int64) string {
	if ns == 0 {
		return "—"
	}
	return time.Unix(0, ns).UTC().Format("2006-01-02 15:04:05 UTC")
}
