package relay_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/calltap/calltap/cmd/stacktest"
	"github.com/prometheus/common/expfmt"
)

// /metrics counts each seat's deliveries and queue in valid Prometheus
// text: each family's samples together under its TYPE, and label values
// escaped as the format escapes them, whatever text a claim holds (Go's
// %q would write \u00a0, which no scraper reads, and the whole page would
// fail to scrape).
func TestClaimMetrics(t *testing.T) {
	st := stacktest.Start(t, stacktest.Options{NoAgent: true})
	dialPeer(t, st, "default")
	dialPeer(t, st, "alice", aliceClaim)
	odd := "call.variables.developer=zoë\u00a0\u200b\"x\\"
	dialPeer(t, st, "odd", odd)
	bob := dialPeer(t, st, "bob", bobClaim)
	bob.close()
	waitAway(t, st, seatOf(t, st, bobClaim))
	for _, body := range []string{event(1, "c1", "alice"), event(2, "c1", ""), event(3, "c2", "")} {
		if status, answer := ask(t, st, body); status != http.StatusOK {
			t.Fatalf("%s: %d %s", body, status, answer)
		}
	}
	queuedForAlice(t, st, []string{event(4, "c3", "bob"), event(5, "c3", "")})

	text := metrics(t, st)
	familiesGrouped(t, text)
	fams, err := new(expfmt.TextParser).TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("/metrics is not valid Prometheus text: %v\n%s", err, text)
	}
	seats := map[string]string{st.TunnelID: "", seatOf(t, st, aliceClaim): aliceClaim, seatOf(t, st, bobClaim): bobClaim, seatOf(t, st, odd): odd}
	wantDelivered := map[string]float64{st.TunnelID: 1, seatOf(t, st, aliceClaim): 2}
	wantQueued := map[string]float64{seatOf(t, st, bobClaim): 2}
	for name, want := range map[string]map[string]float64{"calltap_claim_deliveries_total": wantDelivered, "calltap_claim_queue_depth": wantQueued} {
		got := map[string]float64{}
		for _, m := range fams[name].GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			seat := labels["seat"]
			if claims, ok := seats[seat]; !ok || labels["claims"] != claims || labels["token"] != "alice" {
				t.Errorf("%s: unexpected labels %v", name, labels)
			}
			got[seat] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
		if len(got) != len(seats) {
			t.Errorf("%s has %d seats, want %d:\n%s", name, len(got), len(seats), text)
		}
		for seat := range seats {
			if got[seat] != want[seat] {
				t.Errorf("%s{seat=%q} = %v, want %v", name, seat, got[seat], want[seat])
			}
		}
	}
}

// familiesGrouped checks that each family's samples follow its own TYPE
// line, one group per family, as the text format requires.
func familiesGrouped(t *testing.T, text string) {
	t.Helper()
	typed := map[string]bool{}
	current := ""
	for _, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		if f, ok := strings.CutPrefix(line, "# TYPE "); ok {
			current, _, _ = strings.Cut(f, " ")
			if typed[current] {
				t.Errorf("family %s is typed twice", current)
			}
			typed[current] = true
			continue
		}
		if strings.HasPrefix(line, "#") {
			continue
		}
		if name := line[:strings.IndexAny(line, "{ ")]; name != current {
			t.Errorf("sample %q is not under its family's TYPE (it follows %s's)", line, current)
		}
	}
}
