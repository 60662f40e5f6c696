package check

import (
	"cmp"
	"encoding/xml"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/calltap/calltap/scripts/chaos/history"
)

// synthetic is a two-minute run of one sender sending a delivery every
// 200 ms through five faults, during which attempts are refused 503 with
// Retry-After and sent again; one delivery, badID, is answered 200 by
// nobody (lost and invented), and its tunnel name holds markup.
func synthetic() *history.History {
	r := newRun()
	r.h.Meta.Minutes, r.h.Meta.Ended, r.h.Meta.Drained = 2, at(120), at(125)
	r.fault(history.FaultSigkill, "agent", 20, 23).
		fault(history.FaultSigstop, "relay-1", 40, 50).
		fault(history.FaultNetSlow, "agent->relay-1", 60, 75).
		fault(history.FaultDiskFull, "agent", 80, 90).
		fault(history.FaultPowerCut, "agent", 100, 103)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 600 {
		d := fmt.Sprintf("d-%04d", i)
		sent := float64(i) * 0.2
		for attempt := 1; ; attempt++ {
			f := faultAt(r.h.Faults, sent)
			if f == nil || attempt > 4 {
				lat := 0.005 + rng.Float64()*0.03
				if f != nil && f.Kind == history.FaultNetSlow {
					lat += 0.2 + rng.Float64()*0.6
				}
				r.ok(d, attempt, sent, sent+lat*0.8, sent+lat, 1).capture("p-"+d, d, sent+lat*0.5, "delivered", 200, "")
				break
			}
			wait := 0.002
			if f.Kind == history.FaultSigstop {
				wait = 2 + rng.Float64()*8
			}
			r.send(d, attempt, sent, sent+wait, 503, envelope("agent_offline"), "5")
			sent += wait + 1 + float64(attempt)
		}
	}
	r.send(badID, 1, 70, 70.01, 200, answer(badID, 1), "").capture("p-bad", badID, 70.005, "delivered", 200, "")
	r.h.Sends[len(r.h.Sends)-1].Tunnel = "<b>t&1</b>"
	// The handler logs copies in the order it receives them.
	slices.SortStableFunc(r.h.Handler, func(a, b history.Copy) int { return cmp.Compare(a.ReceivedAt, b.ReceivedAt) })
	return &r.h
}

const badID = "d-bad-<0042>"

func faultAt(fs []history.Fault, t float64) *history.Fault {
	for i, f := range fs {
		if at(t) >= f.Start && at(t) < f.End {
			return &fs[i]
		}
	}
	return nil
}

// TestReport renders the page of a synthetic run with faults and a
// violation: it parses, holds the timeline with a band per fault and the
// violation's mark, escapes what the history holds, and refers to nothing
// on the network.
func TestReport(t *testing.T) {
	h := synthetic()
	r := Check(h)
	if r.OK() {
		t.Fatal("the synthetic run's planted violation was not found")
	}
	page := render(t, h, r)
	selfContained(t, page)
	escaped(t, page, r)
	drawn(t, page, h, r)
}

// TestReportNamesHandlers: the page of a run with routes names each
// handler and what its route takes, counts the copies each got, and lists
// the route rule; a run without routes shows none of it.
func TestReportNamesHandlers(t *testing.T) {
	for _, routed := range []bool{true, false} {
		h := &aliceCall(history.DefaultRoute).h // d4 at the wrong handler: one route violation
		if !routed {
			h = &clean().h
		}
		page := render(t, h, Check(h))
		elements(t, page)
		if !strings.Contains(page, "<td>Route</td>") {
			t.Error("the rules table lacks the route rule")
		}
		for _, want := range []string{"The handlers, one per route", "<td>media</td><td>events call.recording_*, call.analysis_*</td>",
			"<td>alice</td><td>call.variables.developer = alice", "<td>default</td><td>what no route takes (--forward-to)</td>",
			"<td>at the media handler</td><td class=\"n\">1</td>", "<td>at the alice handler</td><td class=\"n\">1</td>",
			"<td>at the default handler</td><td class=\"n\">4</td>", "<td>route</td><td class=\"n bad\">1</td>"} {
			if got := strings.Contains(page, want); got != routed {
				t.Errorf("routed %v: the page holds %q: %v", routed, want, got)
			}
		}
	}
}

// TestReportNamesAgents: the page of a run with claimants names each
// agent and what it claims, counts the copies each got, and lists the
// claim rules; a run without claimants shows none of it.
func TestReportNamesAgents(t *testing.T) {
	for _, claimed := range []bool{true, false} {
		h := &aliceClaims("").h // d4 at the default agent: one claim violation, and one of its store
		if !claimed {
			h = &clean().h
		}
		page := render(t, h, Check(h))
		elements(t, page)
		if !strings.Contains(page, "<td>Claim</td>") || !strings.Contains(page, "<td>ClaimStore</td>") {
			t.Error("the rules table lacks the claim rules")
		}
		for _, want := range []string{"The agents sharing the token",
			"<td>alice&#39;s agent</td><td>calls whose first event names call.variables.developer = alice",
			"<td>the default agent</td><td>the calls nobody claims",
			"<td>at alice&#39;s agent</td><td class=\"n\">2</td>", "<td>at bob&#39;s agent</td><td class=\"n\">0</td>",
			"<td>claim</td><td class=\"n bad\">2</td>"} {
			if got := strings.Contains(page, want); got != claimed {
				t.Errorf("claimed %v: the page holds %q: %v", claimed, want, got)
			}
		}
	}
}

// render writes the page of h, judged r, and reads it back.
func render(t *testing.T, h *history.History, r Result) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "report.html")
	if err := WriteReport(path, h, r); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// selfContained: nothing in the page reaches the network.
func selfContained(t *testing.T, page string) {
	t.Helper()
	if m := regexp.MustCompile(`(?i)https?:|//[a-z0-9.-]+\.[a-z]{2,}/|<script|<link|@import|url\(`).FindString(page); m != "" {
		t.Errorf("the page refers outside itself: %q", m)
	}
}

// escaped: the page says what the history holds, its text escaped.
func escaped(t *testing.T, page string, r Result) {
	t.Helper()
	if strings.Contains(page, "ZgotmplZ") {
		t.Error("html/template refused a value (ZgotmplZ)")
	}
	for _, want := range []string{r.Verdict(), "sigkill", "relay-1", "net-slow", "disk-full", "power-cut",
		"d-bad-&lt;0042&gt;", "&lt;b&gt;t&amp;1&lt;/b&gt;"} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	if strings.Contains(page, "<0042>") || strings.Contains(page, "<b>t&1") {
		t.Error("a value from the history reached the page unescaped")
	}
}

// drawn: the page parses, its SVG is well formed and holds the lines,
// a band per fault and a mark per violation, labelled.
func drawn(t *testing.T, page string, h *history.History, r Result) {
	t.Helper()
	el := elements(t, page)
	if el["svg"] != 1 || el["polyline"] < 2 || el["path"] < 2 {
		t.Errorf("the timeline is missing: elements %v", el)
	}
	if got := el["rect.band"]; got != len(h.Faults) {
		t.Errorf("%d fault bands, want %d", got, len(h.Faults))
	}
	if el["line.viol"] != len(r.Violations) || el["text.violl"] == 0 {
		t.Errorf("violations marked %d (labelled %d), want %d", el["line.viol"], el["text.violl"], len(r.Violations))
	}
	svg := page[strings.Index(page, "<svg") : strings.Index(page, "</svg>")+len("</svg>")]
	strict := xml.NewDecoder(strings.NewReader(svg))
	for {
		if _, err := strict.Token(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("the SVG is not well formed: %v", err)
		}
	}
}

// elements parses page as HTML (the standard library's lenient XML mode
// with HTML's void elements and entities) and counts its elements by name,
// and by name.class.
func elements(t *testing.T, page string) map[string]int {
	t.Helper()
	d := xml.NewDecoder(strings.NewReader(page))
	d.Strict, d.AutoClose, d.Entity = false, xml.HTMLAutoClose, xml.HTMLEntity
	n := map[string]int{}
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("the page does not parse: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok {
			n[se.Name.Local]++
			for _, a := range se.Attr {
				if a.Name.Local == "class" {
					n[se.Name.Local+"."+a.Value]++
				}
			}
		}
	}
	if n["html"] != 1 || n["body"] != 1 || n["table"] < 2 {
		t.Fatalf("not a whole page: %v", n)
	}
	return n
}
