package main

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// measures is one build's rounds: per round, each process's CPU (µs) and
// system calls per request.
func measures(rounds ...map[string][2]float64) []*costCell {
	var ms []*costCell
	for _, r := range rounds {
		m := &costCell{cpu: map[string]time.Duration{}, syscalls: map[string]float64{}}
		for name, v := range r {
			m.cpu[name] = time.Duration(v[0] * float64(time.Microsecond))
			m.syscalls[name] = v[1]
		}
		ms = append(ms, m)
	}
	return ms
}

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		xs   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{7}, 7},
		{[]float64{9, 1, 5}, 5},
		{[]float64{4, 1, 3, 100}, 3.5},
	} {
		if got := median(tc.xs); got != tc.want {
			t.Errorf("median(%v) = %v, want %v", tc.xs, got, tc.want)
		}
	}
}

func TestABRows(t *testing.T) {
	// The agent: CPU +5% (within) but system calls +20% (not): not met.
	// The relay: CPU exactly +10% and calls -10% in each round, the third
	// on a machine 9 times slower: met, the ratio of each round holding.
	cell := &abCell{sync: "full", conns: 32,
		before: measures(
			map[string][2]float64{"relay": {100, 10}, "agent": {200, 20}, "handler": {50, 4}},
			map[string][2]float64{"relay": {100, 10}, "agent": {200, 20}, "handler": {50, 4}},
			map[string][2]float64{"relay": {900, 90}, "agent": {200, 20}, "handler": {50, 4}},
		),
		after: measures(
			map[string][2]float64{"relay": {110, 9}, "agent": {210, 24}, "handler": {80, 4}},
			map[string][2]float64{"relay": {110, 9}, "agent": {210, 24}, "handler": {80, 4}},
			map[string][2]float64{"relay": {990, 81}, "agent": {210, 24}, "handler": {80, 4}},
		),
	}
	rows := buildsForm("7890542").rows([]*abCell{cell})
	if len(rows) != 5 || !rows[0].Head || rows[4].Note == "" {
		t.Fatalf("want a head, three processes and a note; got %+v", rows)
	}
	if !strings.Contains(rows[4].Note, "7890542") || !strings.Contains(rows[4].Note, "3 interleaved rounds") {
		t.Errorf("note: %s", rows[4].Note)
	}
	checkProcRows(t, rows[1:4], map[string]procRow{
		"relay":   {[]string{"--sync full", "c=32", "relay", "100 µs", "110 µs", "+10.0%", "10.0", "9.0", "-10.0%"}, "≤ +10%", "met"},
		"agent":   {[]string{"--sync full", "c=32", "agent", "200 µs", "210 µs", "+5.0%", "20.0", "24.0", "+20.0%"}, "≤ +10%", "**not met**"},
		"handler": {[]string{"--sync full", "c=32", "handler", "50 µs", "80 µs", "+60.0%", "4.0", "4.0", "+0.0%"}, "none: the control", ""},
	})
}

// procRow is what an A/B table's row of a process should hold.
type procRow struct {
	cells       []string
	target, met string
}

// checkProcRows checks each row against want's row of its process.
func checkProcRows(t *testing.T, rows []row, want map[string]procRow) {
	t.Helper()
	for _, x := range rows {
		w := want[x.Cells[2]]
		if !slices.Equal(x.Cells, w.cells) || x.Target != w.target || x.Met != w.met {
			t.Errorf("%s: got %q %q %q, want %q %q %q", x.Cells[2], x.Cells, x.Target, x.Met, w.cells, w.target, w.met)
		}
	}
}

func TestABCompareZero(t *testing.T) {
	if c := (abCompare{before: 0, after: 0}); !c.within(abLimit) || c.pct() != "+0.0%" {
		t.Errorf("0 → 0: %v %s", c.within(abLimit), c.pct())
	}
	if c := (abCompare{before: 0, after: 1}); c.within(abLimit) {
		t.Error("0 → 1 counted as within +10%")
	}
	// The rounds' ratios decide, not the medians': a machine that slowed
	// down in the after half of rounds 2 and 3 moves the medians 3.3×.
	c := abCompare{before: 100, after: 330, rounds: []float64{1.1, 3.3, 1.1}}
	if c.pct() != "+10.0%" || !c.within(abLimit) {
		t.Errorf("rounds 1.1, 3.3, 1.1: %s", c.pct())
	}
}
