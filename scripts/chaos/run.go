package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/calltap/calltap/scripts/chaos/check"
	"github.com/calltap/calltap/scripts/chaos/history"
)

// The availability bounds the README states ("Stopping and restarting"):
// a sender waits at most the relay's --stop-grace (20 s) for an answer,
// and agents leave a frozen node within 10 s, so senders go without a 2xx
// no longer than that.
var bounds = history.Bounds{AnswerMaxMS: 20_000, No2xxMaxMS: 10_000}

// result is what a run found.
type result struct {
	ok      bool // no safety violation
	verdict string
	report  string
	check   check.Result
}

// recorder holds the history files a run appends to.
type recorder struct {
	sends   *history.Log[history.Send]
	handler *history.Log[history.Copy]
	faults  *history.Log[history.Fault]
}

func openRecorder(dir string) (*recorder, error) {
	var r recorder
	var err error
	if r.sends, err = history.Create[history.Send](dir, history.SendsFile); err != nil {
		return nil, err
	}
	if r.handler, err = history.Create[history.Copy](dir, history.HandlerFile); err != nil {
		return nil, err
	}
	if r.faults, err = history.Create[history.Fault](dir, history.FaultsFile); err != nil {
		return nil, err
	}
	return &r, nil
}

func (r *recorder) close() error {
	return errors.Join(r.sends.Close(), r.handler.Close(), r.faults.Close())
}

// run is one chaos run in cfg.out: the topology up, traffic and faults for
// cfg.minutes, then the drain, the store read, and the checker's verdict.
// Every child process is gone and the agent's disk unmounted when it
// returns. Its own log goes to chaos.log in the run's folder and to logw.
func run(ctx context.Context, cfg config, logw io.Writer) (result, error) {
	if err := os.RemoveAll(cfg.out); err != nil {
		return result{}, err
	}
	top := &topology{mode: cfg.mode(), bin: cfg.bin, natsBin: cfg.natsBin, logs: filepath.Join(cfg.out, "logs"), work: filepath.Join(cfg.out, "work")}
	for _, d := range []string{top.logs, top.work} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return result{}, err
		}
	}
	logf, err := os.Create(filepath.Join(cfg.out, "chaos.log"))
	if err != nil {
		return result{}, err
	}
	defer logf.Close()
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(io.MultiWriter(logf, logw), nil)))
	defer slog.SetDefault(prev)

	rec, err := openRecorder(cfg.out)
	if err != nil {
		return result{}, err
	}
	defer rec.close()
	meta := history.Meta{Seed: cfg.seed, Mode: cfg.mode(), Minutes: cfg.minutes, Bounds: bounds,
		Routes: chaosRoutes(routeDeveloper(cfg.claims)), Claimants: chaosClaimants(cfg.claims)}
	slog.Info("chaos: starting", "mode", meta.Mode, "claimants", len(meta.Claimants), "seed", cfg.seed, "minutes", cfg.minutes, "bin", cfg.bin, "out", cfg.out)

	top.proxies = newProxies()
	defer top.proxies.close()
	if top.disk, err = newAgentDisk(filepath.Join(top.work, "agent-disk")); err != nil {
		return result{}, err
	}
	defer top.disk.unmount()
	defer top.stopAll() // runs before the unmount
	slog.Info("chaos: the agent's disk", "disk", top.disk.String())

	h, err := bringUp(ctx, top, rec, meta, cfg.out)
	if err != nil {
		return result{}, err
	}
	defer h.close()

	if err := exercise(ctx, cfg, top, h, rec, &meta); err != nil {
		return result{}, err
	}
	if err := drain(ctx, top, h, &meta, cfg.out); err != nil {
		return result{}, err
	}
	if err := rec.close(); err != nil {
		return result{}, err
	}
	return judge(cfg.out)
}

// bringUp starts the topology and the handler's servers, and writes the
// default agent's route file (meta's routes, each to its server) into dir.
func bringUp(ctx context.Context, top *topology, rec *recorder, meta history.Meta, dir string) (*handler, error) {
	calls := &registry{}
	if top.mode == history.ModeTeam {
		if err := top.startNATS(ctx, 3); err != nil {
			return nil, err
		}
		if err := top.startRelays(ctx, 3); err != nil {
			return nil, err
		}
	} else if err := top.startRelays(ctx, 1); err != nil {
		return nil, err
	}
	if err := top.createToken(ctx); err != nil {
		return nil, err
	}
	h, err := startHandler(rec.handler, calls, top.tunnel, handlerServers(meta.Routes, meta.Claimants))
	if err != nil {
		return nil, err
	}
	if err := startAgents(ctx, top, h, meta, dir); err != nil {
		h.close()
		return nil, err
	}
	slog.Info("chaos: topology up", "relays", top.relayURLs, "nats", top.natsURLs, "tunnel", top.tunnel, "handlers", h.urls)
	return h, nil
}

// startAgents starts the default agent (on its disk, with the route file)
// and each claimant's (on a folder of its own, forwarding to its own
// server), and waits until the relay holds them all.
func startAgents(ctx context.Context, top *topology, h *handler, meta history.Meta, dir string) error {
	file := filepath.Join(dir, routesFile)
	urls := routeURLs(h.urls)
	if err := writeRoutes(file, meta.Routes, urls); err != nil {
		return err
	}
	var err error
	top.agent, err = top.startAgent(agentSpec{name: "agent", data: top.disk.data, forwardTo: urls[history.DefaultRoute], routes: file})
	if err != nil {
		return err
	}
	var claims []string
	for _, c := range meta.Claimants {
		name := history.ClaimantProc(c.Name)
		p, err := top.startAgent(agentSpec{name: name, data: filepath.Join(top.work, name),
			forwardTo: h.urls[server{seat: c.Name, route: history.DefaultRoute}], claim: claimFlag(c)})
		if err != nil {
			return err
		}
		top.claimants = append(top.claimants, p)
		claims = append(claims, claimFlag(c))
	}
	// An agent that exits at start (a claim refused, a flag this build
	// lacks) will not connect: that is said at once, with its reason.
	exited := func() bool { return slices.ContainsFunc(top.agents(), func(p *proc) bool { return !p.running() }) }
	err = until(ctx, time.Minute, func() bool { return exited() || top.agentsUp(claims) })
	if err == nil && exited() {
		err = errors.New("an agent exited")
	}
	if err != nil {
		var logs []string
		for _, p := range top.agents() {
			logs = append(logs, fmt.Sprintf("%s: %s", p.name, cause(p.logf)))
		}
		return fmt.Errorf("the agents did not all connect: %w (%s)", err, strings.Join(logs, "; "))
	}
	return nil
}

// exercise runs the traffic and the nemesis for cfg.minutes, then lets the
// senders finish their retries.
func exercise(ctx context.Context, cfg config, top *topology, h *handler, rec *recorder, meta *history.Meta) error {
	total := time.Duration(cfg.minutes * float64(time.Minute))
	sched := plan(cfg.seed, total, shape{relays: len(top.relays), nats: len(top.nats), diskLimited: top.disk.limited(), agents: procNames(top.agents())})
	if err := writeSchedule(cfg.out, sched); err != nil {
		return err
	}
	slog.Info("chaos: the nemesis's schedule", "faults", len(sched), "file", "schedule.json")

	s := newSenders(top.relayURLs, top.tunnel, rec.sends, h.calls, trafficMix(cfg.claims), cfg.seed)
	stop := make(chan struct{})
	meta.Started = time.Now().UnixNano()
	go s.run(stop)
	n := &nemesis{top: top, acked: s.isAccepted, log: rec.faults, start: time.Now()}
	n.run(ctx, sched)
	select {
	case <-ctx.Done():
	case <-time.After(time.Until(n.start.Add(total))):
	}
	close(stop)
	meta.Ended = time.Now().UnixNano()
	top.revive()
	slog.Info("chaos: schedule over; the senders finish their retries")
	done := make(chan struct{})
	go func() { s.wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		return ctx.Err()
	}
	accepted := s.acceptedIDs()
	slog.Info("chaos: senders done; waiting for the handler to get every accepted delivery", "accepted", len(accepted))
	err := until(ctx, 2*time.Minute, func() bool {
		for _, id := range accepted {
			if h.count(id) == 0 {
				return false
			}
		}
		return true
	})
	if err != nil {
		slog.Warn("chaos: some accepted deliveries never reached the handler", "err", err)
	}
	return ctx.Err()
}

// drain waits until the handler has been quiet for a moment, stops the
// agents in order, reads their stores and writes store.jsonl and
// meta.json.
func drain(ctx context.Context, top *topology, h *handler, meta *history.Meta, dir string) error {
	until(ctx, time.Minute, func() bool { return time.Since(h.lastCopy()) > 3*time.Second })
	top.revive()
	for _, a := range top.agents() {
		a.term(stopGrace)
	}
	caps := readAgentStore(ctx, top.bin, top.disk.data, filepath.Join(dir, "agent-copy"), top.tunnel)
	for _, c := range meta.Claimants {
		name := history.ClaimantProc(c.Name)
		cs, err := readStore(ctx, top.bin, filepath.Join(top.work, name), top.tunnel)
		if err != nil {
			slog.Error("chaos: a claimant's store cannot be read; judging the run without it", "agent", name, "err", err)
		}
		for _, cp := range cs {
			cp.Seat = c.Name
			caps = append(caps, cp)
		}
	}
	meta.Drained = time.Now().UnixNano()
	store, err := history.Create[history.Capture](dir, history.StoreFile)
	if err != nil {
		return err
	}
	for _, c := range caps {
		store.Append(c)
	}
	if err := store.Close(); err != nil {
		return err
	}
	slog.Info("chaos: stores read", "captures", len(caps))
	return history.WriteMeta(dir, *meta)
}

// readAgentStore reads the default agent's store. One calltap cannot read
// where it lies (a full disk) is a finding; the verdict is then on a copy
// of it on a disk with room (at cp), and on an empty store only if that
// cannot be read either.
func readAgentStore(ctx context.Context, bin, data, cp, tunnel string) []history.Capture {
	caps, err := readStore(ctx, bin, data, tunnel)
	if err == nil {
		return caps
	}
	slog.Error("chaos: the agent's store cannot be read in place; reading a copy", "err", err)
	if err = os.CopyFS(cp, os.DirFS(data)); err == nil {
		caps, err = readStore(ctx, bin, cp, tunnel)
	}
	if err != nil {
		slog.Error("chaos: the copy of the agent's store cannot be read either; judging the run with an empty store", "err", err)
	}
	return caps
}

// judge checks the recorded history and writes the report.
func judge(dir string) (result, error) {
	hist, err := history.Read(dir)
	if err != nil {
		return result{}, err
	}
	r := check.Check(hist)
	page := filepath.Join(dir, "report.html")
	if err := check.WriteReport(page, hist, r); err != nil {
		return result{}, err
	}
	return result{ok: r.OK(), verdict: r.Verdict(), report: page, check: r}, nil
}

// writeSchedule keeps the nemesis's plan beside the history, so that two
// runs of a seed can be compared.
func writeSchedule(dir string, sched []fault) error {
	b, err := json.MarshalIndent(sched, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "schedule.json"), append(b, '\n'), 0o644)
}
