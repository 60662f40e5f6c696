// Package check judges a chaos run: Check reads a recorded history (package
// history) and lists every broken promise of calltap it holds, and
// WriteReport draws the run as one self-contained HTML page. Check is a pure
// function of the history: the same folder always gets the same verdict, so a
// saved run can be re-checked (go run ./scripts/chaos/report DIR) after the
// rules change.
//
// Each rule is one function in rules.go (the route rule, with its reading
// of the run's route file, in route.go) with the rule stated in its
// comment. The safety rules (loss, invented answer, store agreement, order,
// once, route) give violations; availability is measured per fault and
// reported against the README's bounds, never counted as a violation, so
// that a busy machine cannot fail a run.
//
// The runner, once its run has drained and the store is written:
//
//	h, err := history.Read(dir)
//	r := check.Check(h)
//	err = check.WriteReport(filepath.Join(dir, "report.html"), h, r)
//	fmt.Println(r.Verdict()) // and the page's path
//
// and a test of a short run fails with t.Fatal(r.Summary(20)) when !r.OK().
package check

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/calltap/calltap/scripts/chaos/history"
)

// Violation kinds: the promises of issue 31, point 3, the route one of
// issue 40, and the claim one of issue 41.
const (
	KindLoss     = "loss"
	KindInvented = "invented-answer"
	KindStore    = "store-disagrees"
	KindOrder    = "order"
	KindOnce     = "once"
	KindRoute    = "route"
	KindClaim    = "claim"
)

// kinds are the Kind* constants in the order the verdict and the report
// list them.
func kinds() []string {
	return []string{KindLoss, KindInvented, KindStore, KindOrder, KindOnce, KindRoute, KindClaim}
}

// Violation is one broken promise, found in the history.
type Violation struct {
	Kind string `json:"kind"` // one of the Kind* constants
	// Rule names the rule that found it (the function's name without
	// "rule"), e.g. "RefusedAfterDelivery".
	Rule       string `json:"rule"`
	DeliveryID string `json:"delivery_id"`
	Tunnel     string `json:"tunnel"`
	// At is when the evidence happened (an answer, a handler copy), in
	// the history's clock; the report marks it on the timeline.
	At int64 `json:"at"`
	// Message says what happened in one sentence, times relative to the
	// run's start.
	Message string `json:"message"`
}

// violation is a rule's finding about delivery d, its tunnel filled in.
func (ix *index) violation(kind, rule, d string, at int64, format string, args ...any) Violation {
	return Violation{Kind: kind, Rule: rule, DeliveryID: d, Tunnel: ix.tunnel[d], At: at,
		Message: fmt.Sprintf(format, args...)}
}

// Counts sums up the run for the report's table.
type Counts struct {
	Deliveries     int            // distinct delivery ids sent
	Attempts       int            // HTTP attempts of all senders
	ByClass        map[string]int // attempts by answer class: 2xx, 202, 4xx, 5xx, other, none
	Accepted       int            // deliveries answered 2xx (202 included) at least once
	HandlerCopies  int            // requests the handler received, at all its servers
	ByRoute        map[string]int // the default agent's handler copies by the route whose server got them (none without routes)
	BySeat         map[string]int // handler copies by the claimant whose agent's server got them (none without claimants)
	Duplicates     int            // handler copies beyond the first of their delivery
	Captures       int            // captures in the store after the drain
	CaptureStates  map[string]int // captures by state
	CaptureDupes   int            // captures marked duplicate_of
	Faults         int
	FaultsByKind   map[string]int
	ViolationsKind map[string]int // violations by kind
}

// Waits measures how long senders waited and how long nobody got a 2xx.
type Waits struct {
	Attempts int           // attempts sent in the window
	NoAnswer int           // of them, attempts that got no answer (status 0)
	P50      time.Duration // over the answered attempts
	P99      time.Duration
	Max      time.Duration
	// No2xx is the longest stretch inside the window in which no sender
	// got a 2xx; from the window's start to the first 2xx counts.
	No2xx      time.Duration
	No2xxFrom  int64 // where that stretch starts
	OverAnswer bool  // Max exceeds meta.bounds.answer_max_ms
	OverNo2xx  bool  // No2xx exceeds meta.bounds.no_2xx_max_ms
}

// FaultWaits is the availability measured around one fault.
type FaultWaits struct {
	Fault history.Fault
	// From and To bound the window measured: the fault's start to its end
	// plus RecoverySlack (to the run's end when it never ended).
	From, To int64
	// Seat, when Scoped, is the agent whose calls alone the waits are of:
	// in a run with claimants, a fault of one agent or its links is
	// measured over that agent's calls (defaultSeat: the default agent's).
	Seat   string
	Scoped bool
	Waits
}

// KindWaits is the worst of the faults of one kind on one kind of target:
// e.g. under a SIGSTOP of an agent, the longest any agent's callers went
// without a 2xx.
type KindWaits struct {
	Kind   string // a history.Fault* kind
	On     string // what it hit: targetClass
	Faults int
	Max    time.Duration // the longest wait for an answer
	No2xx  time.Duration // the longest stretch without a 2xx
	// Over the bounds, as in Waits.
	OverAnswer, OverNo2xx bool
}

// Result is the checker's verdict on one run.
type Result struct {
	Meta       history.Meta
	Violations []Violation // sorted by time, then kind and delivery id
	Counts     Counts
	Overall    Waits // the whole run, start to end
	PerFault   []FaultWaits
	ByKind     []KindWaits // PerFault's worst per kind and target class, by kind then class
}

// OK reports whether the run kept every safety promise.
func (r Result) OK() bool { return len(r.Violations) == 0 }

// Verdict is the one line the terminal prints, e.g.
// "chaos: PASS — 0 violations in 12,345 requests, 96 faults (seed 42, team, 30 min)".
func (r Result) Verdict() string {
	word := "PASS"
	what := "0 violations"
	if !r.OK() {
		word = "FAIL"
		what = fmt.Sprintf("%s violation%s (%s)", thousands(len(r.Violations)), plural(len(r.Violations)), r.kindList())
	}
	return fmt.Sprintf("chaos: %s — %s in %s request%s, %s fault%s (seed %d, %s, %s min)",
		word, what, thousands(r.Counts.Deliveries), plural(r.Counts.Deliveries), thousands(r.Counts.Faults), plural(r.Counts.Faults),
		r.Meta.Seed, r.Meta.Mode, trimFloat(r.Meta.Minutes))
}

// Summary is the verdict and then the first n violations, one a line: for
// a test's failure message or a terminal.
func (r Result) Summary(n int) string {
	var b strings.Builder
	b.WriteString(r.Verdict())
	for i, v := range r.Violations {
		if i == n {
			fmt.Fprintf(&b, "\n  … and %d more", len(r.Violations)-n)
			break
		}
		fmt.Fprintf(&b, "\n  %s %s (%s) %s: %s", v.Kind, v.DeliveryID, v.Rule, v.Tunnel, v.Message)
	}
	return b.String()
}

// kindList is "2 loss, 1 order", in the order of the kinds' constants.
func (r Result) kindList() string {
	var parts []string
	for _, k := range kinds() {
		if n := r.Counts.ViolationsKind[k]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, k))
		}
	}
	return strings.Join(parts, ", ")
}

// Check judges the history h. It reads h and never changes it.
func Check(h *history.History) Result {
	ix := newIndex(h)
	var vs []Violation
	for _, rule := range rules {
		vs = append(vs, rule(ix)...)
	}
	slices.SortStableFunc(vs, func(a, b Violation) int {
		return cmp.Or(cmp.Compare(a.At, b.At), cmp.Compare(a.Kind, b.Kind),
			cmp.Compare(a.DeliveryID, b.DeliveryID), cmp.Compare(a.Rule, b.Rule))
	})
	r := Result{Meta: h.Meta, Violations: vs, Counts: count(ix, vs)}
	all := allTraffic(ix)
	r.Overall = measure(ix, all, h.Meta.Started, runEnd(h))
	var bySeat map[string]traffic
	if len(h.Meta.Claimants) > 0 {
		bySeat = seatTraffic(ix, newSeats(ix))
	}
	for _, f := range h.Faults {
		from, to := faultWindow(h, f)
		fw := FaultWaits{Fault: f, From: from, To: to}
		tr := all
		if bySeat != nil {
			if fw.Seat, fw.Scoped = faultSeat(f.Target, h.Meta.Claimants); fw.Scoped {
				tr = bySeat[fw.Seat]
			}
		}
		fw.Waits = measure(ix, tr, from, to)
		r.PerFault = append(r.PerFault, fw)
	}
	r.ByKind = byKind(r.PerFault)
	return r
}

func count(ix *index, vs []Violation) Counts {
	h := ix.h
	c := Counts{
		Deliveries: len(ix.order), Attempts: len(h.Sends), HandlerCopies: len(h.Handler),
		Captures: len(h.Store), Faults: len(h.Faults),
		ByClass: map[string]int{}, ByRoute: map[string]int{}, BySeat: map[string]int{}, CaptureStates: map[string]int{}, FaultsByKind: map[string]int{},
		ViolationsKind: map[string]int{},
	}
	for _, s := range h.Sends {
		c.ByClass[statusClass(s.Status)]++
	}
	for _, cp := range h.Handler {
		switch {
		case cp.Seat != defaultSeat:
			c.BySeat[cp.Seat]++
		case cp.Route != "":
			c.ByRoute[cp.Route]++
		}
	}
	for _, d := range ix.order {
		if ix.accepted(d) >= 0 {
			c.Accepted++
		}
		if n := len(ix.copies[d]); n > 1 {
			c.Duplicates += n - 1
		}
	}
	for _, p := range h.Store {
		c.CaptureStates[p.State]++
		if p.DuplicateOf != "" {
			c.CaptureDupes++
		}
	}
	for _, f := range h.Faults {
		c.FaultsByKind[f.Kind]++
	}
	for _, v := range vs {
		c.ViolationsKind[v.Kind]++
	}
	return c
}

// statusClass is the column an attempt is counted in.
func statusClass(status int) string {
	switch {
	case status == 0:
		return "none"
	case status == 202:
		return "202"
	case status >= 200 && status < 300:
		return "2xx"
	case status >= 400 && status < 500:
		return "4xx"
	case status >= 500 && status < 600:
		return "5xx"
	}
	return "other"
}

// rel formats t as seconds since the run's start, for messages.
func (ix *index) rel(t int64) string {
	return fmt.Sprintf("t+%.3fs", float64(t-ix.h.Meta.Started)/1e9)
}

func thousands(n int) string {
	s := fmt.Sprint(n)
	if n < 0 {
		return "-" + thousands(-n)
	}
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	return b.String()
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func trimFloat(f float64) string { return strconv.FormatFloat(math.Round(f*100)/100, 'f', -1, 64) }
