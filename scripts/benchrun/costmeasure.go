package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/calltap/calltap/scripts/benchrun/load"
	"github.com/calltap/calltap/scripts/benchrun/perf"
)

// What every run of the cost part measures: a relay and an agent in front
// of the handler, a 2 KB load through them, and each process's CPU, system
// calls and context switches per request.

// costProcs are the processes a request through calltap runs in.
var costProcs = []string{"relay", "agent", "handler"}

// costCell is one load (c) on one setup (--sync).
type costCell struct {
	sync  string
	conns int

	direct, through load.Result
	fsync           time.Duration // the agent's disk: 4 KiB append + fdatasync, p50

	cpu      map[string]time.Duration // per request, in the load's window
	cpuAll   map[string]time.Duration // per request, with what the load left to do after its window (until idle)
	syscalls map[string]float64       // per request
	switches map[string]float64       // per request (thread wake-ups)

	listed, found []time.Duration // c=1 only: from a request's answer until the inspector lists it, and finds it by text

	profiles map[string]perf.Profile // relay/agent → its samples by stage (--perf only)
}

func (c *costCell) label() string { return fmt.Sprintf("--sync %s, c=%d", c.sync, c.conns) }

// startCostPair starts a relay and an agent of bin with --sync mode and
// agentArgs, in dir, in front of the handler hp at hurl, and names the
// pids of the processes a request runs in. On an error nothing is left
// running.
func startCostPair(ctx context.Context, bin, dir, mode string, hp *proc, hurl string, agentArgs []string) (*calltap, map[string]int, error) {
	ct, err := newCalltap(ctx, bin, dir, hurl, relayFlagsNoLimits...)
	if err != nil {
		return nil, nil, err
	}
	ct.agentArgs = append([]string{"--sync", mode}, agentArgs...)
	err = ct.startRelay(ctx)
	if err == nil {
		err = ct.startAgent(ctx, true)
	}
	if err != nil {
		ct.stop()
		return nil, nil, err
	}
	return ct, map[string]int{"relay": ct.relay.pid(), "agent": ct.agent.pid(), "handler": hp.pid()}, nil
}

// alive is an error once the relay or the agent has died (under load).
func (c *calltap) alive() error {
	if c.relay.exited() || c.agent.exited() {
		return errors.New("the relay or the agent died under load (see their logs in " + c.dir + ")")
	}
	return nil
}

// costSpecs are the 2 KB load with conns connections straight to the
// handler at hurl and through ct's tunnel.
func costSpecs(ct *calltap, hurl string, conns int, warm, dur time.Duration) (direct, through load.Spec) {
	ev, stamp := jsonEvent2K()
	hu, _ := url.Parse(hurl)
	ru, _ := url.Parse(ct.relayURL)
	direct = load.Spec{Addr: hu.Host, Path: "/webhooks/voice", Body: ev, Stamp: stamp, ContentType: "application/json",
		Conns: conns, Warmup: warm, Duration: dur}
	through = direct
	through.Addr, through.Path = ru.Host, ct.tunnelPath+"/voice"
	return direct, through
}

// waitIdle returns once no process of pids has used more than 2 ms of CPU
// in half a second (30 s at most).
func waitIdle(ctx context.Context, pids map[string]int) error {
	last := map[string]time.Duration{}
	for name, pid := range pids {
		last[name], _ = procCPU(pid)
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
		idle := true
		for name, pid := range pids {
			t, _ := procCPU(pid)
			if t-last[name] > 2*time.Millisecond {
				idle = false
			}
			last[name] = t
		}
		if idle {
			return nil
		}
	}
	return nil
}

// measure loads calltap twice: once clean, for the latency and the CPU
// time of each process, charged to the requests of the window; then
// under perf stat, for each process's system calls and context switches
// per request (counting every system call slows them a little).
func (c *costCell) measure(ctx context.Context, spec load.Spec, pids map[string]int, dir string) error {
	cpu0 := map[string]time.Duration{}
	cpu1 := map[string]time.Duration{}
	clean := spec
	clean.OnStart = func() {
		for _, name := range costProcs {
			cpu0[name], _ = procCPU(pids[name])
		}
	}
	clean.OnEnd = func() {
		for _, name := range costProcs {
			cpu1[name], _ = procCPU(pids[name])
		}
	}
	r, err := load.Run(ctx, clean)
	if err != nil {
		return err
	}
	c.through = r
	n := time.Duration(max(r.N, 1))
	c.cpu = map[string]time.Duration{}
	for _, name := range costProcs {
		c.cpu[name] = (cpu1[name] - cpu0[name]) / n
	}
	// What the load left to do once it ended (captures applied to the
	// store, the search index) is its cost too: CPU is read again once
	// every process is idle.
	if err := waitIdle(ctx, pids); err != nil {
		return err
	}
	c.cpuAll = map[string]time.Duration{}
	for _, name := range costProcs {
		t, _ := procCPU(pids[name])
		c.cpuAll[name] = (t - cpu0[name]) / n
	}

	return c.measureCalls(ctx, spec, pids, dir)
}

// measureCalls loads calltap again under perf stat, for each process's
// system calls and context switches per request.
func (c *costCell) measureCalls(ctx context.Context, spec load.Spec, pids map[string]int, dir string) error {
	r, counts, err := perf.Stat(ctx, spec, costProcs, pids, dir)
	if err != nil {
		return err
	}
	c.syscalls, c.switches = map[string]float64{}, map[string]float64{}
	for _, name := range costProcs {
		reqs := r.Rate() * counts[name].Elapsed.Seconds() // the load is steady: its rate over perf's own span
		c.syscalls[name] = counts[name].Syscalls / reqs
		c.switches[name] = counts[name].Switches / reqs
	}
	return nil
}
