package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/calltap/calltap/scripts/benchrun/load"
	"github.com/calltap/calltap/scripts/benchrun/perf"
)

// The cost part: what one 2 KB webhook costs each process on its way
// through calltap — CPU, system calls and context switches of the relay,
// the agent and the handler per request — with the p50 it adds beside the
// machine's own fsync p50, and, with --perf, where the relay's and the
// agent's CPU goes, stage by stage, from perf record's call stacks. Here:
// its flags and its plain run; the A/B runs (--baseline, --routes-ab) are
// costab.go's and costroutes.go's, what every run measures costmeasure.go's
// (with perf: package perf).

const (
	costTable    = "Cost per 2 KB request"
	latencyTable = "Cost per 2 KB request: the p50 it adds"
	visibleTable = "Cost per 2 KB request: when the inspector shows it"
)

// costOpts are the cost part's flags.
type costOpts struct {
	bin, out, work string
	dur, warm      time.Duration
	perf           bool
	keep, label    string
	base           string
	rounds         int
	routes         string // absolute
	routesAB       bool
	claimsAB       bool
}

func parseCostFlags(args []string) (costOpts, error) {
	var o costOpts
	fs := flag.NewFlagSet("cost", flag.ContinueOnError)
	fs.StringVar(&o.bin, "bin", "bin/calltap", "the calltap binary (with symbols for --perf: go build -o bin/calltap-prof ./cmd/calltap)")
	fs.StringVar(&o.out, "out", "", "results file")
	fs.StringVar(&o.work, "work", "", "scratch directory (default: a new one under $TMPDIR)")
	fs.DurationVar(&o.dur, "duration", 5*time.Second, "measured window of each load")
	fs.DurationVar(&o.warm, "warmup", time.Second, "warmup before each window")
	fs.BoolVar(&o.perf, "perf", false, "also record the relay's and the agent's call stacks and break their CPU down by stage")
	fs.StringVar(&o.keep, "perf-keep", "", "keep the perf record files in this directory")
	fs.StringVar(&o.label, "label", "", "name this build's tables, which then carry no targets; with --baseline, name the baseline")
	fs.StringVar(&o.base, "baseline", "", "also run a baseline build, in turns with this one, and print after ÷ before (no perf record, no inspector probe)")
	fs.IntVar(&o.rounds, "rounds", 3, "with --baseline or --routes-ab: the interleaved rounds of each load")
	fs.StringVar(&o.routes, "routes", "", "run every agent with this route `FILE` (calltap listen --routes FILE); with --routes-ab, instead of the bench's 10-route file")
	fs.BoolVar(&o.routesAB, "routes-ab", false, "instead: this build's agent with a 10-route file and with none, in turns, and print routes ÷ none (no perf record, no inspector probe)")
	fs.BoolVar(&o.claimsAB, "claims-ab", false, "instead: this build's agent with 10 claims and with none, in turns, and print claims ÷ none (no perf record, no inspector probe)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if o.routes != "" {
		abs, err := filepath.Abs(o.routes)
		if err != nil {
			return o, err
		}
		o.routes = abs
	}
	return o, o.check()
}

// check refuses flags that do not go together.
func (o costOpts) check() error {
	runs := 0
	for _, on := range []bool{o.base != "", o.routesAB, o.claimsAB} {
		if on {
			runs++
		}
	}
	switch {
	case runs > 1:
		return errors.New("--baseline, --routes-ab and --claims-ab are runs of their own: give one")
	case runs == 1 && (o.perf || o.rounds < 1):
		return errors.New("--baseline, --routes-ab and --claims-ab take --rounds 1 or more, and no --perf (a profile is the plain run's)")
	case (o.routesAB || o.claimsAB) && o.label != "":
		return errors.New("--label names a build, and --routes-ab and --claims-ab run one")
	}
	return nil
}

// agentArgs are the flags every agent of the run gets besides --sync.
func (o costOpts) agentArgs() []string {
	if o.routes == "" {
		return nil
	}
	return []string{"--routes", o.routes}
}

// abRun is an A/B run of after and before in pt.
func (o costOpts) abRun(pt *part, after, before abSide) abRun {
	return abRun{after: after, before: before, dir: pt.dir, hp: pt.hp, hurl: pt.hurl, warm: o.warm, dur: o.dur, rounds: o.rounds}
}

func cmdCost(ctx context.Context, args []string) error {
	o, err := parseCostFlags(args)
	if err != nil {
		return err
	}
	if _, err := exec.LookPath("perf"); err != nil {
		return errors.New("perf is missing: apt-get install -y linux-perf")
	}
	pt, err := openPart(o.out, o.work, "cost")
	if err != nil {
		return err
	}
	defer pt.close()
	if o.keep != "" {
		if err := os.MkdirAll(o.keep, 0o755); err != nil {
			return err
		}
	}
	switch {
	case o.base != "":
		r := o.abRun(pt, abSide{name: "after", bin: o.bin, args: o.agentArgs()}, abSide{name: "before", bin: o.base, args: o.agentArgs()})
		return reportAB(ctx, pt.res, r, buildsForm(cmp.Or(o.label, o.base)))
	case o.routesAB:
		routes, form, err := routesSide(pt, o.bin, o.routes)
		if err != nil {
			return err
		}
		return reportAB(ctx, pt.res, o.abRun(pt, routes, abSide{name: "none", bin: o.bin}), form)
	case o.claimsAB:
		claims, form := claimsSide(o.bin)
		return reportAB(ctx, pt.res, o.abRun(pt, claims, abSide{name: "none", bin: o.bin, args: o.agentArgs()}), form)
	}
	var cells []*costCell
	for _, mode := range []string{"full", "normal"} {
		cs, err := costSetup(ctx, o, pt, mode)
		if err != nil {
			return fmt.Errorf("--sync %s: %w", mode, err)
		}
		cells = append(cells, cs...)
	}
	reportCost(pt.res, cells, o.perf, o.label)
	return nil
}

// costSetup starts a relay and an agent with --sync mode and measures
// every load on them.
func costSetup(ctx context.Context, o costOpts, pt *part, mode string) ([]*costCell, error) {
	dir, hurl := filepath.Join(pt.dir, "sync-"+mode), pt.hurl
	ct, pids, err := startCostPair(ctx, o.bin, dir, mode, pt.hp, hurl, o.agentArgs())
	if err != nil {
		return nil, err
	}
	defer ct.stop()
	var cells []*costCell
	for _, conns := range []int{1, 32} {
		c := &costCell{sync: mode, conns: conns}
		direct, through := costSpecs(ct, hurl, conns, o.warm, o.dur)
		if c.fsync, err = fsyncP50(filepath.Join(dir, "agent")); err != nil {
			return nil, fmt.Errorf("fsync probe: %w", err)
		}
		fmt.Fprintf(os.Stderr, "cost: %-22s direct\n", c.label())
		if c.direct, err = load.Run(ctx, direct); err != nil {
			return nil, err
		}
		fmt.Fprintf(os.Stderr, "cost: %-22s through calltap: CPU, perf stat\n", c.label())
		if err := c.measure(ctx, through, pids, dir); err != nil {
			return nil, err
		}
		if err := ct.alive(); err != nil {
			return nil, err
		}
		if conns == 1 {
			fmt.Fprintf(os.Stderr, "cost: %-22s through calltap: the inspector lists and finds each\n", c.label())
			if c.listed, c.found, err = visibility(ctx, ct, 20); err != nil {
				return nil, err
			}
		}
		if o.perf {
			fmt.Fprintf(os.Stderr, "cost: %-22s through calltap: perf record\n", c.label())
			if err := c.profile(ctx, through, pids, dir, o.keep); err != nil {
				return nil, err
			}
		}
		cells = append(cells, c)
	}
	return cells, nil
}

// profile samples the relay's and the agent's call stacks (perf record)
// under the load, and counts the samples of each stage; keep, if not "",
// is where the recordings are kept.
func (c *costCell) profile(ctx context.Context, spec load.Spec, pids map[string]int, dir, keep string) error {
	file := func(name string) string { return filepath.Join(dir, fmt.Sprintf("perf-%s-c%d.data", name, c.conns)) }
	profiles, err := perf.Profiles(ctx, spec, []perf.Process{perf.Relay(), perf.Agent()}, pids, file)
	if err != nil {
		return err
	}
	c.profiles = profiles
	for name := range profiles {
		if keep != "" {
			if err := os.Rename(file(name), filepath.Join(keep, fmt.Sprintf("cost-sync-%s-c%d-%s.data", c.sync, c.conns, name))); err != nil {
				fmt.Fprintf(os.Stderr, "cost: not kept: %v\n", err)
			}
		}
		os.Remove(file(name))
	}
	return nil
}

// visibility sends n requests through the tunnel one at a time, each with
// a word of its own in its path and body, and measures from each answer
// until the inspector lists it (newest first) and until its text search
// finds it, polling every millisecond.
func visibility(ctx context.Context, ct *calltap, n int) (listed, found []time.Duration, err error) {
	client := &http.Client{Timeout: 10 * time.Second}
	get := func(u string) (string, error) {
		resp, err := client.Get(u)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}
	until := func(u, word string) (time.Duration, error) {
		start := time.Now()
		for time.Since(start) < 10*time.Second {
			b, err := get(u)
			if err != nil {
				return 0, err
			}
			if strings.Contains(b, word) {
				return time.Since(start), nil
			}
			select {
			case <-ctx.Done():
				return 0, ctx.Err()
			case <-time.After(time.Millisecond):
			}
		}
		return 0, fmt.Errorf("the inspector did not show %s within 10 s", word)
	}
	for i := range n {
		word := fmt.Sprintf("vis%dx%d", i, time.Now().UnixNano())
		resp, err := client.Post(ct.relayURL+ct.tunnelPath+"/voice/"+word, "application/json",
			strings.NewReader(`{"event":"call.ended","marker":"`+word+`"}`))
		if err != nil {
			return nil, nil, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			return nil, nil, fmt.Errorf("a request through the tunnel: %s", resp.Status)
		}
		l, err := until(ct.inspectURL+"/api/v1/ext/webhooks/?limit=1", word)
		if err != nil {
			return nil, nil, err
		}
		f, err := until(ct.inspectURL+"/api/v1/ext/webhooks/?limit=1&q="+word, word)
		if err != nil {
			return nil, nil, err
		}
		listed, found = append(listed, l), append(found, l+f)
	}
	return listed, found, nil
}

// fsyncP50 is the p50 of appending 4 KiB to a file in dir and
// fdatasyncing it, 200 times: what one durable commit costs at least.
func fsyncP50(dir string) (time.Duration, error) {
	f, err := os.CreateTemp(dir, "fsync-probe-")
	if err != nil {
		return 0, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	block := make([]byte, 4096)
	lat := make([]time.Duration, 0, 200)
	for range 200 {
		t := time.Now()
		if _, err := f.Write(block); err != nil {
			return 0, err
		}
		if err := syscall.Fdatasync(int(f.Fd())); err != nil {
			return 0, err
		}
		lat = append(lat, time.Since(t))
	}
	slices.Sort(lat)
	return lat[len(lat)/2], nil
}

func reportCost(res *results, cells []*costCell, profiled bool, label string) {
	r := costReport{res: res, label: label}
	r.costRows(cells)
	r.latencyRows(cells)
	r.visibleRows(cells)
	if !profiled {
		return
	}
	for _, p := range []perf.Process{perf.Agent(), perf.Relay()} {
		r.stageRows(cells, p, "Cost per 2 KB request: the "+p.Name+"'s CPU by stage")
	}
}

// costReport writes the cost part's tables.
type costReport struct {
	res   *results
	label string
}

// add adds x. A labelled run (a baseline build) prints its own tables,
// with no targets: they are the current build's.
func (r costReport) add(x row) {
	if r.label != "" {
		x.Table += " — " + r.label
		x.Target, x.Met = "", ""
	}
	r.res.add(x)
}

// syscallLimit is the target of system calls per request of a process
// under a load, 0 for none.
func syscallLimit(conns int, name string) float64 {
	switch {
	case conns == 1 && name != "handler":
		return 15
	case conns > 1 && name == "agent":
		return 6
	case conns > 1 && name == "relay":
		return 5
	}
	return 0
}

func (r costReport) costRows(cells []*costCell) {
	r.add(row{Table: costTable, Head: true, Cells: []string{"Setup", "Load", "Process", "CPU", "CPU until idle", "System calls", "Context switches"}})
	for _, c := range cells {
		for _, name := range costProcs {
			x := row{Table: costTable, Cells: []string{"--sync " + c.sync, fmt.Sprintf("c=%d", c.conns), name,
				fmtDur(c.cpu[name]), fmtDur(c.cpuAll[name]), fmt.Sprintf("%.1f", c.syscalls[name]), fmt.Sprintf("%.1f", c.switches[name])}}
			if limit := syscallLimit(c.conns, name); limit > 0 {
				x.Target, x.Met = fmt.Sprintf("≤ %.0f system calls", limit), verdict(c.syscalls[name] <= limit)
			}
			r.add(x)
		}
	}
	r.add(row{Table: costTable, Note: "Per request, in the load's window: CPU of all threads (/proc/PID/stat); CPU until idle adds what the load left to do " +
		"once it ended (captures applied to the store, the search index), read when every process is idle; system calls " +
		"(perf stat -e raw_syscalls:sys_enter) and context switches, i.e. thread wake-ups (perf stat -e context-switches)."})
}

func (r costReport) latencyRows(cells []*costCell) {
	r.add(row{Table: latencyTable, Head: true, Cells: []string{"Setup", "Load", "p50 direct", "p50 through calltap", "Added p50", "fsync p50"}})
	for _, c := range cells {
		added := c.through.Pct(50) - c.direct.Pct(50)
		x := row{Table: latencyTable, Cells: []string{"--sync " + c.sync, fmt.Sprintf("c=%d", c.conns),
			fmtDur(c.direct.Pct(50)) + failed(c.direct), fmtDur(c.through.Pct(50)) + failed(c.through), fmtDelta(added), fmtDur(c.fsync)}}
		if c.conns == 1 {
			limit := 200 * time.Microsecond
			x.Target = "≤ +200 µs"
			if c.sync == "full" {
				limit += c.fsync
				x.Target = "≤ fsync p50 + 200 µs = " + fmtDur(limit)
			}
			x.Met = verdict(added <= limit)
		}
		r.add(x)
	}
	r.add(row{Table: latencyTable, Note: "fsync p50: 4 KiB appended to a file in the agent's data directory and fdatasync'd, 200 times, while idle."})
}

func (r costReport) visibleRows(cells []*costCell) {
	r.add(row{Table: visibleTable, Head: true, Cells: []string{"Setup", "After its answer, the inspector", "p50", "max"}})
	for _, c := range cells {
		if len(c.listed) == 0 {
			continue
		}
		for _, v := range []struct {
			what   string
			ds     []time.Duration
			limit  time.Duration
			target string
		}{
			{"lists it (newest first)", c.listed, 50 * time.Millisecond, "max ≤ 50 ms"},
			{"finds it by text", c.found, time.Second, "max ≤ 1 s"},
		} {
			ds := slices.Clone(v.ds)
			slices.Sort(ds)
			r.add(row{Table: visibleTable, Cells: []string{"--sync " + c.sync, v.what, fmtDur(ds[len(ds)/2]), fmtDur(ds[len(ds)-1])},
				Target: v.target, Met: verdict(ds[len(ds)-1] <= v.limit)})
		}
	}
	r.add(row{Table: visibleTable, Note: "20 requests one at a time, each with a word of its own; from the sender's answer until the inspector's API lists it, and until its text search (?q=) finds it, polled every millisecond."})
}

// stageRows writes where a process's CPU went, by stage, from its profile.
func (r costReport) stageRows(cells []*costCell, p perf.Process, title string) {
	head := []string{"Stage"}
	for _, c := range cells {
		head = append(head, c.label())
	}
	r.add(row{Table: title, Head: true, Cells: head})
	for _, s := range p.Stages {
		x := row{Table: title, Cells: []string{s}}
		for _, c := range cells {
			prof := c.profiles[p.Name]
			share := float64(prof.Stages[s]) / float64(max(prof.Samples(), 1))
			x.Cells = append(x.Cells, fmt.Sprintf("%.0f%% · %s", 100*share, fmtDur(time.Duration(share*float64(c.cpu[p.Name])))))
		}
		r.add(x)
	}
	x := row{Table: title, Cells: []string{"samples"}}
	for _, c := range cells {
		x.Cells = append(x.Cells, fmtCount(c.profiles[p.Name].Samples()))
	}
	r.add(x)
	r.add(row{Table: title, Note: "perf record -F 999 -g on the " + p.Name + " under the same load: % of samples, and that share of its CPU per request. " +
		"A sample goes to the stage of its innermost frame that a stage's pattern matches (scripts/benchrun/perf/stages.go)."})
	for _, c := range cells {
		if top := c.profiles[p.Name].TopOther(3); top != "" {
			fmt.Fprintf(os.Stderr, "cost: %s, %s: other: %s\n", p.Name, c.label(), top)
		}
	}
}
