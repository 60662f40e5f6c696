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

// The cost part's A/B modes: this build and a baseline (benchrun cost
// --baseline BIN), or this build's agent with a route file and without one
// (--routes-ab), each side with a relay and an agent of its own in front
// of the one handler, loaded back to back in interleaved rounds. Measured
// minutes apart, the same code's cost moved 10–46% on a busy 2-core
// machine; measured in turns, with the order alternated (ABBA), a drift
// in the machine's speed falls on both builds alike, and the handler, the
// same code in both, shows what noise is left.

const abTable = "Cost per 2 KB request: after ÷ before"

// abLimit is the most a process of this build may cost over the baseline
// (issue 32 point 5: within +10%), and the agent with a 10-route file over
// none (issue 40 point 6: within +10%).
const abLimit = 1.10

// abRun is an A/B run's settings.
type abRun struct {
	after, before abSide // this build, the baseline; with routes, without
	dir           string
	hp            *proc
	hurl          string
	warm, dur     time.Duration
	rounds        int
}

// abSide is what one side of an A/B run runs.
type abSide struct {
	name string   // in the progress lines: "after", "before", "10 routes", "none"
	bin  string   // the calltap binary
	args []string // more flags for its agent (--routes FILE)
}

// abBuild is one side's relay+agent pair in an A/B run.
type abBuild struct {
	abSide
	after bool // the side the ratio divides: after ÷ before
	dir   string
	ct    *calltap
	pids  map[string]int
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

// reportAB runs r and adds its table, in form f, to res.
func reportAB(ctx context.Context, res *results, r abRun, f abForm) error {
	cells, err := costAB(ctx, r)
	if err != nil {
		return err
	}
	for _, x := range f.rows(cells) {
		res.add(x)
	}
	return nil
}

// setup starts both sides' pairs with --sync mode and runs the rounds of
// each load on them. Only the pair being measured is loaded: the other
// idles.
func (r abRun) setup(ctx context.Context, mode string) ([]*abCell, error) {
	builds := []*abBuild{{abSide: r.after, after: true}, {abSide: r.before}}
	for _, b := range builds {
		b.dir = filepath.Join(r.dir, "sync-"+mode+"-before")
		if b.after {
			b.dir = filepath.Join(r.dir, "sync-"+mode+"-after")
		}
		ct, pids, err := startCostPair(ctx, b.bin, b.dir, mode, r.hp, r.hurl, b.args)
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

// round measures both sides once, back to back: after then before in
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
		if b.after {
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

func (c abCompare) within(limit float64) bool { return c.ratio() <= limit }

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

// abForm is how an A/B run's table reads.
type abForm struct {
	table         string
	before, after string   // what the columns call each side
	held          []string // the processes held to limit; the others are controls
	limit         float64  // what a held process may cost over the other side; abLimit when 0
	side          string   // what a side is, in the note: "build"
	sides, met    string   // the note's opening (what each side runs) and close (what is held, what the controls show)
}

// buildsForm is the table of this build over a baseline, which before
// names: the relay and the agent are held to +10%.
func buildsForm(before string) abForm {
	return abForm{table: abTable, before: "before", after: "after", held: []string{"relay", "agent"}, side: "build",
		sides: fmt.Sprintf("Before: %s; after: this build.", before),
		met: "Met: CPU and system calls both within +10%. The handler's code is the same in both builds: its row is the " +
			"control, its ratio the machine's noise."}
}

// note says what the sides ran and how they were measured over rounds.
func (f abForm) note(rounds int) string {
	return fmt.Sprintf("%s %d interleaved rounds, the order alternated (%[3]s, %[4]s; %[4]s, %[3]s; …); each figure is "+
		"the %[5]s's median, the ratio the median of the rounds' ratios (a round measures both %[5]ss back to back, so its "+
		"ratio holds while the machine's speed drifts); each %[5]s has its own relay and agent, the handler is shared. Per "+
		"request, in the load's window: CPU of all threads (/proc/PID/stat), system calls (perf stat -e raw_syscalls:sys_enter). %[6]s",
		f.sides, rounds, f.after, f.before, f.side, f.met)
}

// rows is the table: per setup, load and process, the medians of each
// side and their ratio; the held processes' rows hold both within +10%,
// the others are the control.
func (f abForm) rows(cells []*abCell) []row {
	ratio := f.after + "÷" + f.before
	rows := []row{{Table: f.table, Head: true, Cells: []string{"Setup", "Load", "Process",
		"CPU " + f.before, "CPU " + f.after, "CPU " + ratio, "System calls " + f.before, "System calls " + f.after, "System calls " + ratio}}}
	rounds := 0
	for _, c := range cells {
		rounds = max(rounds, len(c.after))
		for _, name := range costProcs {
			cpu, calls := abMedians(c, name)
			x := row{Table: f.table, Cells: []string{"--sync " + c.sync, fmt.Sprintf("c=%d", c.conns), name,
				fmtDur(time.Duration(cpu.before)), fmtDur(time.Duration(cpu.after)), cpu.pct(),
				fmt.Sprintf("%.1f", calls.before), fmt.Sprintf("%.1f", calls.after), calls.pct()}}
			if limit := cmp.Or(f.limit, abLimit); slices.Contains(f.held, name) {
				x.Target, x.Met = fmt.Sprintf("≤ %+.0f%%", 100*(limit-1)), verdict(cpu.within(limit) && calls.within(limit))
			} else {
				x.Target = "none: the control"
			}
			rows = append(rows, x)
		}
	}
	return append(rows, row{Table: f.table, Note: f.note(rounds)})
}
