package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/calltap/calltap/scripts/benchrun/load"
	"github.com/calltap/calltap/scripts/benchrun/perf"
)

// cell is one load shape measured both ways.
type cell struct {
	name        string
	body        []byte
	stamp       int
	contentType string
	conns       int

	direct, calltap    load.Result
	relayCPU, agentCPU time.Duration // during the calltap windows
	relayHWM, agentHWM int64         // VmHWM, largest over the rounds
}

func cmdTunnel(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("tunnel", flag.ContinueOnError)
	bin := fs.String("bin", "bin/calltap", "the calltap binary")
	out := fs.String("out", "", "results file")
	work := fs.String("work", "", "scratch directory (default: a new one under $TMPDIR)")
	rounds := fs.Int("rounds", 3, "side-by-side rounds; each runs every cell both ways, alternating which goes first")
	dur := fs.Duration("duration", 3*time.Second, "measured window of each run")
	warm := fs.Duration("warmup", time.Second, "warmup before each window")
	only := fs.String("only", "", "run only the cells whose name contains this (e.g. '2 KB')")
	perfDir := fs.String("perf", "", "record `perf` profiles of the relay and agent (round 1, c=32) into this directory")
	if err := fs.Parse(args); err != nil {
		return err
	}
	pt, err := openPart(*out, *work, "tunnel")
	if err != nil {
		return err
	}
	defer pt.close()
	res, dir, hurl := pt.res, pt.dir, pt.hurl
	hu, _ := url.Parse(hurl)

	ev, stamp := jsonEvent2K()
	big := binaryBody(1 << 20)
	cells := []*cell{
		{name: "2 KB JSON POST, c=1", body: ev, stamp: stamp, contentType: "application/json", conns: 1},
		{name: "2 KB JSON POST, c=32", body: ev, stamp: stamp, contentType: "application/json", conns: 32},
		{name: "1 MiB POST, c=1", body: big, contentType: "application/octet-stream", conns: 1},
		{name: "1 MiB POST, c=32", body: big, contentType: "application/octet-stream", conns: 32},
	}
	cells = slices.DeleteFunc(cells, func(c *cell) bool { return !strings.Contains(c.name, *only) })
	for round := range *rounds {
		for _, c := range cells {
			runDirect := func() error {
				fmt.Fprintf(os.Stderr, "tunnel: round %d/%d  %-22s direct\n", round+1, *rounds, c.name)
				r, err := load.Run(ctx, load.Spec{Addr: hu.Host, Path: "/webhooks/voice", Body: c.body, Stamp: c.stamp,
					ContentType: c.contentType, Conns: c.conns, Warmup: *warm, Duration: *dur})
				c.direct.Merge(r)
				return err
			}
			runCalltap := func() error {
				fmt.Fprintf(os.Stderr, "tunnel: round %d/%d  %-22s through calltap\n", round+1, *rounds, c.name)
				prefix := ""
				if *perfDir != "" && round == 0 {
					prefix = filepath.Join(*perfDir, fmt.Sprintf("%dk-c%d", len(c.body)>>10, c.conns))
				}
				return c.runCalltap(ctx, *bin, filepath.Join(dir, fmt.Sprintf("ct-%d", round)), hurl, *warm, *dur, prefix)
			}
			first, second := runDirect, runCalltap
			if round%2 == 1 {
				first, second = runCalltap, runDirect
			}
			if err := first(); err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			if err := second(); err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
		}
	}
	for _, c := range cells {
		c.report(res)
	}
	return nil
}

// runCalltap starts a fresh relay and agent (fresh store, fresh peak RSS),
// loads them, and charges their CPU time in the window to the requests
// completed in it.
func (c *cell) runCalltap(ctx context.Context, bin, dir, handlerURL string, warm, dur time.Duration, perfPrefix string) error {
	defer os.RemoveAll(dir)
	ct, err := newCalltap(ctx, bin, dir, handlerURL, relayFlagsNoLimits...)
	if err != nil {
		return err
	}
	defer ct.stop()
	if err := ct.startRelay(ctx); err != nil {
		return err
	}
	if err := ct.startAgent(ctx, true); err != nil {
		return err
	}
	var r0, a0, r1, a1 time.Duration
	var perfs []*perf.Recording
	u, _ := url.Parse(ct.relayURL)
	r, err := load.Run(ctx, load.Spec{Addr: u.Host, Path: ct.tunnelPath + "/voice", Body: c.body, Stamp: c.stamp,
		ContentType: c.contentType, Conns: c.conns, Warmup: warm, Duration: dur,
		OnStart: func() {
			r0, _ = procCPU(ct.relay.pid())
			a0, _ = procCPU(ct.agent.pid())
			if perfPrefix != "" {
				perfs = append(perfs, perf.Record(perfPrefix+"-relay.data", ct.relay.pid()), perf.Record(perfPrefix+"-agent.data", ct.agent.pid()))
			}
		},
		OnEnd: func() {
			r1, _ = procCPU(ct.relay.pid())
			a1, _ = procCPU(ct.agent.pid())
			for _, p := range perfs {
				p.Stop()
			}
		}})
	for _, p := range perfs {
		p.Wait()
	}
	if err != nil {
		return err
	}
	if ct.relay.exited() || ct.agent.exited() {
		return errors.New("the relay or the agent died under load (see their logs)")
	}
	c.calltap.Merge(r)
	c.relayCPU += r1 - r0
	c.agentCPU += a1 - a0
	rh, _ := procStatus(ct.relay.pid(), "VmHWM")
	ah, _ := procStatus(ct.agent.pid(), "VmHWM")
	c.relayHWM = max(c.relayHWM, rh)
	c.agentHWM = max(c.agentHWM, ah)
	return nil
}

func (c *cell) report(res *results) {
	d, t := &c.direct, &c.calltap
	ratio := t.Rate() / d.Rate()
	rateRow := row{Measure: c.name + ": requests/s", Direct: fmtRate(d.Rate(), "/s"), Calltap: fmtRate(t.Rate(), "/s"),
		Ratio: fmt.Sprintf("%.2f×", ratio)}
	rateRow.Calltap += failed(*t)
	rateRow.Direct += failed(*d)
	switch {
	case len(c.body) < 1<<20 && c.conns > 1:
		rateRow.Target, rateRow.Met = "≥ 0.30×", verdict(ratio >= 0.30)
	case len(c.body) >= 1<<20 && c.conns > 1:
		rateRow.Target, rateRow.Met = "≥ 0.15×", verdict(ratio >= 0.15)
	}
	res.add(rateRow)

	add50, add99 := t.Pct(50)-d.Pct(50), t.Pct(99)-d.Pct(99)
	latRow := row{Measure: c.name + ": latency p50 / p99",
		Direct: fmtDur(d.Pct(50)) + " / " + fmtDur(d.Pct(99)), Calltap: fmtDur(t.Pct(50)) + " / " + fmtDur(t.Pct(99)),
		Ratio: fmtDelta(add50) + " / " + fmtDelta(add99)}
	if len(c.body) < 1<<20 && c.conns == 1 {
		latRow.Target, latRow.Met = "≤ +250 µs at p50", verdict(add50 <= 250*time.Microsecond)
	}
	res.add(latRow)

	n := time.Duration(max(t.N, 1))
	res.add(row{Measure: c.name + ": CPU per request, relay / agent", Calltap: fmtDur(c.relayCPU/n) + " / " + fmtDur(c.agentCPU/n)})
	res.add(row{Measure: c.name + ": peak RSS, relay / agent", Calltap: fmtBytes(float64(c.relayHWM)) + " / " + fmtBytes(float64(c.agentHWM))})
}
