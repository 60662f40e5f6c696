package check

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/calltap/calltap/scripts/chaos/history"
)

// TestAvailability measures the waits around a fault: percentiles over the
// attempts sent in its window, the attempts with no answer apart, the
// longest stretch without a 2xx from the fault's start, each against the
// bounds; and none of it is a violation.
func TestAvailability(t *testing.T) {
	r := newRun().fault(history.FaultSigstop, "relay-1", 10, 20)
	// Before the fault: quick answers, outside its window.
	for i := range 10 {
		d := string(rune('a' + i))
		r.ok(d, 1, float64(i), float64(i)+0.001, float64(i)+0.002, 1).capture("p"+d, d, float64(i), "delivered", 200, "")
	}
	// In it: 98 attempts answered 503 after 1 s, one after 7 s, one none.
	for i := range 98 {
		s := 10 + float64(i)*0.1
		r.send("x", i+1, s, s+1, 503, envelope("unavailable"), "2")
	}
	r.send("x", 99, 19.9, 26.9, 503, envelope("unavailable"), "2").send("x", 100, 19.95, 0, 0, "", "")
	r.ok("x", 101, 27, 27.001, 27.002, 1).capture("p", "x", 27, "delivered", 200, "")
	res := Check(&r.h)
	if len(res.PerFault) != 1 {
		t.Fatalf("%d fault windows", len(res.PerFault))
	}
	fw := res.PerFault[0]
	if fw.From != at(10) || fw.To != at(30) {
		t.Errorf("window %s..%s, want the fault's start to its end + %s", r.rel(fw.From), r.rel(fw.To), RecoverySlack)
	}
	checkWaits(t, r, fw.Waits)
	if !res.OK() {
		t.Errorf("availability counted as a violation:\n%s", list(res.Violations))
	}
}

// TestAvailabilityPerSeat: in a run with claimants, a fault of one agent
// is measured over that agent's calls alone (the others' 2xx would hide
// how long its callers waited); a relay node's over every call.
func TestAvailabilityPerSeat(t *testing.T) {
	r := newRun().claimed().
		fault(history.FaultSigstop, "agent-alice", 2, 4).fault(history.FaultSigstop, "relay-0", 2, 4).
		fault(history.FaultNetCut, "agent->relay-1", 2, 4)
	// alice's call: answered 2xx at 1 s and at 9 s only.
	r.ok("a1", 1, 1, 1.001, 1.002, 1).of("a1", "call.started", "c-alice", "alice").seat("a1", "alice").
		ok("a2", 1, 2.5, 9, 9.001, 1).of("a2", "call.connected", "c-alice", "").seat("a2", "alice")
	// The default agent's calls: a 2xx every half second.
	for i := range 30 {
		d := fmt.Sprint("x", i)
		s := float64(i) * 0.5
		r.ok(d, 1, s, s+0.001, s+0.002, 1).of(d, "call.started", "c-"+d, "")
	}
	res := Check(&r.h)
	if len(res.PerFault) != 3 {
		t.Fatalf("%d fault windows", len(res.PerFault))
	}
	alice, relay, link := res.PerFault[0], res.PerFault[1], res.PerFault[2]
	if !alice.Scoped || alice.Seat != "alice" || alice.Attempts != 1 || alice.No2xx.Round(time.Millisecond) != 7001*time.Millisecond {
		t.Errorf("alice's agent stopped: scoped %v to %q, %d attempts, longest without a 2xx %s; want alice's, 1, 7.001s",
			alice.Scoped, alice.Seat, alice.Attempts, alice.No2xx)
	}
	if relay.Scoped || relay.Attempts != 26 || relay.No2xx > time.Second {
		t.Errorf("a relay node stopped: scoped %v, %d attempts, longest without a 2xx %s; want every call's: 26, under 1s",
			relay.Scoped, relay.Attempts, relay.No2xx)
	}
	if !link.Scoped || link.Seat != "" || link.Attempts != 25 {
		t.Errorf("the default agent's link cut: scoped %v to %q, %d attempts; want the default agent's, 25", link.Scoped, link.Seat, link.Attempts)
	}
	page := render(t, &r.h, res)
	if !strings.Contains(page, `<td>agent-alice <span class="small">(alice&#39;s calls)</span></td>`) {
		t.Error("the availability table does not say whose calls a fault of alice's agent was measured over")
	}
	// Per kind: the worst SIGSTOP of an agent is alice's 7 s.
	var kinds []string
	for _, k := range res.ByKind {
		kinds = append(kinds, fmt.Sprintf("%s on %s: %d, %s", k.Kind, k.On, k.Faults, k.No2xx.Round(time.Millisecond)))
	}
	want := []string{"net-cut on an agent's link: 1, 500ms", "sigstop on a relay node: 1, 500ms", "sigstop on an agent: 1, 7.001s"}
	if !slices.Equal(kinds, want) {
		t.Errorf("per kind %q, want %q", kinds, want)
	}
	if !regexp.MustCompile(`<td>an agent</td><td class="n">1</td><td class="n[^"]*">6.5 s</td><td class="n">7.0 s</td></tr>`).MatchString(page) {
		t.Errorf("the per-kind table lacks the SIGSTOP of an agent")
	}
}

// checkWaits holds TestAvailability's expectations of the fault's waits.
func checkWaits(t *testing.T, r *run, w Waits) {
	t.Helper()
	if w.Attempts != 101 || w.NoAnswer != 1 {
		t.Errorf("attempts %d, no answer %d; want 101 and 1", w.Attempts, w.NoAnswer)
	}
	ms := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	if ms(w.P50) != time.Second || ms(w.P99) != time.Second || ms(w.Max) != 7*time.Second {
		t.Errorf("p50 %s p99 %s max %s; want 1s 1s 7s", w.P50, w.P99, w.Max)
	}
	if ms(w.No2xx) != 17002*time.Millisecond || w.No2xxFrom != at(10) {
		t.Errorf("longest without 2xx %s from %s; want 17.002s from the start", w.No2xx, r.rel(w.No2xxFrom))
	}
	if !w.OverAnswer || !w.OverNo2xx {
		t.Errorf("over the bounds: answer %v, no 2xx %v; want both", w.OverAnswer, w.OverNo2xx)
	}
}

func (r *run) rel(t int64) string { return (&index{h: &r.h}).rel(t) }

// TestReportEmpty: a run that recorded nothing still gets its page and
// verdict, with no panic and no violation.
func TestReportEmpty(t *testing.T) {
	h := &newRun().h
	res := Check(h)
	if !res.OK() || res.Verdict() != "chaos: PASS — 0 violations in 0 requests, 0 faults (seed 7, single, 1 min)" {
		t.Fatalf("verdict %q", res.Verdict())
	}
	path := filepath.Join(t.TempDir(), "r.html")
	if err := WriteReport(path, h, res); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(path); err != nil || len(b) == 0 {
		t.Fatalf("no page: %v", err)
	}
}
