package main

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// The cost part's A/B mode (benchrun cost --baseline BIN): this build and
// a baseline, each with a relay and an agent of its own in front of the
// one handler, loaded back to back in interleaved rounds. Measured
// minutes apart, the same code's cost moved 10–46% on a busy 2-core
// machine; measured in turns, with the order alternated (ABBA), a drift
// in the machine's speed falls on both builds alike, and the handler, the
// same code in both, shows what noise is left.

const abTable = "Cost per 2 KB request: after ÷ before"

// abLimit is the most a process of this build may cost over the baseline
// (issue 32 point 5: within +10%).
const abLimit = 1.10

// abRun is an A/B run's settings.
type abRun struct {
	after, before string // the binaries: this build, the baseline
	dir           string
	hp            *proc
	hurl          string
	warm, dur     time.Duration
	rounds        int
}

// abBuild is one build's relay+agent pair in an A/B run.
type abBuild struct {
	name string // "after" or "before"
	bin  string
	dir  string
	ct   *calltap
	pids map[string]int
}

// abCell is one load on one setup: each round's measure of each build.
type abCell struct {
	sync          string
	conns         int
	after, before []*costCell
}

// costAB measures both builds on each setup (--sync full, normal).
func costAB(ctx context.Context, r abRun) ([]*abCell, error) {
	var cells []*abCell
	for _, mode := range []string{"full", "normal"} {
		cs, err := r.setup(ctx, mode)
		if err != nil {
			return nil, fmt.Errorf("--sync %s: %w", mode, err)
		}
		cells = append(cells, cs...)
	}
	return cells, nil
}

// reportAB runs r and adds its table to res; label names the baseline
// (its binary's path if none).
func reportAB(ctx context.Context, res *results, r abRun, label string) error {
	cells, err := costAB(ctx, r)
	if err != nil {
		return err
	}
	for _, x := range abRows(cells, cmp.Or(label, r.before)) {
		res.add(x)
	}
	return nil
}

// setup starts both builds' pairs with --sync mode and runs the rounds of
// each load on them. Only the pair being measured is loaded: the other
// idles.
func (r abRun) setup(ctx context.Context, mode string) ([]*abCell, error) {
	builds := []*abBuild{{name: "after", bin: r.after}, {name: "before", bin: r.before}}
	for _, b := range builds {
		b.dir = filepath.Join(r.dir, "sync-"+mode+"-"+b.name)
		ct, pids, err := startCostPair(ctx, b.bin, b.dir, mode, r.hp, r.hurl)
		if err != nil {
			return nil, fmt.Errorf("%s (%s): %w", b.name, b.bin, err)
		}
		defer ct.stop()
		b.ct, b.pids = ct, pids
	}
	var cells []*abCell
	for _, conns := range []int{1, 32} {
		c := &abCell{sync: mode, conns: conns}
		for round := range r.rounds {
			if err := r.round(ctx, c, builds, round); err != nil {
				return nil, err
			}
		}
		cells = append(cells, c)
	}
	return cells, nil
}

// round measures both builds once, back to back: after then before in
// even rounds (the first), before then after in odd ones.
func (r abRun) round(ctx context.Context, c *abCell, builds []*abBuild, round int) error {
	order := builds
	if round%2 == 1 {
		order = []*abBuild{builds[1], builds[0]}
	}
	for _, b := range order {
		m := &costCell{sync: c.sync, conns: c.conns}
		fmt.Fprintf(os.Stderr, "cost A/B: %-22s round %d, %s: CPU, perf stat\n", m.label(), round+1, b.name)
		_, through := costSpecs(b.ct, r.hurl, c.conns, r.warm, r.dur)
		if err := m.measure(ctx, through, b.pids, b.dir); err != nil {
			return fmt.Errorf("%s: %w", b.name, err)
		}
		if err := b.ct.alive(); err != nil {
			return fmt.Errorf("%s: %w", b.name, err)
		}
		if b.name == "after" {
			c.after = append(c.after, m)
		} else {
			c.before = append(c.before, m)
		}
		fmt.Fprintf(os.Stderr, "cost A/B: %-22s round %d, %-6s %s\n", m.label(), round+1, b.name+":", abRaw(m))
	}
	return nil
}

// abRaw is one measure's numbers per process, for the spread of the rounds.
func abRaw(m *costCell) string {
	var cpu, calls []string
	for _, name := range costProcs {
		cpu = append(cpu, name+" "+fmtDur(m.cpu[name]))
		calls = append(calls, fmt.Sprintf("%s %.1f", name, m.syscalls[name]))
	}
	return "CPU " + strings.Join(cpu, ", ") + "; system calls " + strings.Join(calls, ", ")
}

// abCompare is one figure of a process over the rounds: the median of
// each build, and each round's after ÷ before.
type abCompare struct {
	before, after float64
	// rounds are the rounds' ratios: the two builds of a round were
	// measured back to back, so a round's ratio holds still while the
	// machine's speed drifts from round to round.
	rounds []float64
}

// ratio is the median of the rounds' ratios, or the medians' ratio when
// there are no rounds.
func (c abCompare) ratio() float64 {
	if len(c.rounds) > 0 {
		return median(c.rounds)
	}
	return ratioOf(c.before, c.after)
}

// ratioOf is after ÷ before (1 when both are 0).
func ratioOf(before, after float64) float64 {
	if before == 0 {
		if after == 0 {
			return 1
		}
		return math.Inf(1)
	}
	return after / before
}

func (c abCompare) within() bool { return c.ratio() <= abLimit }

// pct is the ratio as a signed percent: "+4.2%", "-12.0%".
func (c abCompare) pct() string { return fmt.Sprintf("%+.1f%%", 100*(c.ratio()-1)) }

// median is the middle value of xs (the mean of the middle two for an
// even count; 0 for none).
func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	switch {
	case n == 0:
		return 0
	case n%2 == 1:
		return s[n/2]
	default:
		return (s[n/2-1] + s[n/2]) / 2
	}
}

// abMedians compares one process's CPU (in ns) and system calls per
// request over the rounds.
func abMedians(c *abCell, name string) (cpu, calls abCompare) {
	compare := func(v func(*costCell) float64) abCompare {
		var cmp abCompare
		var before, after []float64
		for i := range min(len(c.before), len(c.after)) {
			b, a := v(c.before[i]), v(c.after[i])
			before, after = append(before, b), append(after, a)
			cmp.rounds = append(cmp.rounds, ratioOf(b, a))
		}
		cmp.before, cmp.after = median(before), median(after)
		return cmp
	}
	return compare(func(m *costCell) float64 { return float64(m.cpu[name]) }),
		compare(func(m *costCell) float64 { return m.syscalls[name] })
}

// abRows is the after ÷ before table: per setup, load and process, the
// medians of each build and their ratio; the relay's and the agent's rows
// hold both within +10%, the handler's is the control. before names the
// baseline in the note.
func abRows(cells []*abCell, before string) []row {
	rows := []row{{Table: abTable, Head: true, Cells: []string{"Setup", "Load", "Process",
		"CPU before", "CPU after", "CPU after÷before", "System calls before", "System calls after", "System calls after÷before"}}}
	rounds := 0
	for _, c := range cells {
		rounds = max(rounds, len(c.after))
		for _, name := range costProcs {
			cpu, calls := abMedians(c, name)
			x := row{Table: abTable, Cells: []string{"--sync " + c.sync, fmt.Sprintf("c=%d", c.conns), name,
				fmtDur(time.Duration(cpu.before)), fmtDur(time.Duration(cpu.after)), cpu.pct(),
				fmt.Sprintf("%.1f", calls.before), fmt.Sprintf("%.1f", calls.after), calls.pct()}}
			if name == "handler" {
				x.Target = "none: the control"
			} else {
				x.Target, x.Met = "≤ +10%", verdict(cpu.within() && calls.within())
			}
			rows = append(rows, x)
		}
	}
	rows = append(rows, row{Table: abTable, Note: fmt.Sprintf("Before: %s; after: this build. %d interleaved rounds, the order "+
		"alternated (after, before; before, after; …); before and after are each build's median, after÷before the median of the rounds' "+
		"ratios (a round measures both builds back to back, so its ratio holds while the machine's speed drifts); each build has its own "+
		"relay and agent, the handler is shared. Per request, in the load's window: CPU of all threads (/proc/PID/stat), system calls "+
		"(perf stat -e raw_syscalls:sys_enter). Met: CPU and system calls both within +10%%. The handler's code is the same in both "+
		"builds: its row is the control, its ratio the machine's noise.", before, rounds)})
	return rows
}
