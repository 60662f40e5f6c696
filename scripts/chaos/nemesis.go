package main

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/calltap/calltap/scripts/chaos/history"
)

// fault is one step of the nemesis's schedule. The schedule is a pure
// function of the seed and the topology's shape (plan): the same seed
// gives the same faults, in the same order, with the same holds; when each
// actually starts depends on how long the ones before it took.
type fault struct {
	At      time.Duration // from the run's start, at the earliest
	Hold    time.Duration // how long it lasts before it is healed
	Kind    string        // a history.Fault* kind
	Targets []string      // processes ("relay-1", "nats-0", "agent") or link prefixes ("agent->relay-2", "relay-0->nats")
	Param   int64         // latency in ms (net-slow), bytes before the cut (net-drop), 1 for a black hole (net-cut), MiB left free (disk-full)
	// Then is a second fault on the agent in the middle of a disk-full
	// (sigkill or sigterm, then a start on the full disk), or "".
	Then string
}

// shape is what the schedule may aim at.
type shape struct {
	relays, nats int
	diskLimited  bool
	// agents are the agents' process names, the default one ("agent")
	// first; the disk faults aim at it alone, whose disk they are.
	agents []string
}

// agent picks one of the agents; with only the default one, it draws
// nothing, so that a single-agent run's schedule is the one it always was.
func (sh shape) agent(rng *rand.Rand) string {
	if len(sh.agents) < 2 {
		return "agent"
	}
	return sh.agents[rng.IntN(len(sh.agents))]
}

// procNames are the names of ps.
func procNames(ps []*proc) []string {
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = p.name
	}
	return names
}

// plan draws the schedule for a run of length total: a fault every few
// seconds after a warm-up, none in the last stretch, so that the run ends
// healed and the senders' retries can finish.
func plan(seed int64, total time.Duration, sh shape) []fault {
	rng := rand.New(rand.NewPCG(uint64(seed), 0xfa017))
	var out []fault
	t := 8 * time.Second
	for end := total - 10*time.Second; t < end; {
		f := draw(rng, sh)
		f.At = t
		f.Hold = between(rng, 2*time.Second, 12*time.Second)
		out = append(out, f)
		t += f.Hold + between(rng, 3*time.Second, 10*time.Second)
	}
	return out
}

func between(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(rng.Int64N(int64(hi-lo)))
}

// draw picks one fault: a kind, then its target(s).
func draw(rng *rand.Rand, sh shape) fault {
	kinds := []string{history.FaultSigkill, history.FaultSigterm, history.FaultSigstop,
		history.FaultNetCut, history.FaultNetSlow, history.FaultNetDrop, history.FaultPowerCut}
	if sh.diskLimited {
		kinds = append(kinds, history.FaultDiskFull)
	}
	f := fault{Kind: kinds[rng.IntN(len(kinds))]}
	switch f.Kind {
	case history.FaultSigkill, history.FaultSigterm, history.FaultSigstop:
		f.Targets = processTargets(rng, sh, f.Kind != history.FaultSigterm)
	case history.FaultNetCut, history.FaultNetSlow, history.FaultNetDrop:
		f.Targets = []string{linkTarget(rng, sh)}
		switch f.Kind {
		case history.FaultNetCut:
			f.Param = rng.Int64N(2) // 0: connections reset and refused; 1: a black hole
		case history.FaultNetSlow:
			f.Param = 200 + rng.Int64N(2800) // ms each way
		case history.FaultNetDrop:
			f.Param = 64 + rng.Int64N(8192) // bytes a connection carries before it is cut
		}
	case history.FaultDiskFull:
		f.Targets = []string{"agent"}
		f.Param = rng.Int64N(7) // a disk left with a few MiB is as likely in life as one with none
		if rng.IntN(2) == 0 {
			f.Then = []string{history.FaultSigkill, history.FaultSigterm}[rng.IntN(2)]
		}
	default: // power-cut
		f.Targets = []string{"agent"}
	}
	return f
}

// processTargets picks a relay node, a NATS server, an agent, or (when
// pair) two NATS servers at once. With several agents, an agent is drawn
// twice as often, so that each claimant's is still killed and frozen
// several times in a long run.
func processTargets(rng *rand.Rand, sh shape, pair bool) []string {
	choices := 3 // relay, agent, one NATS server
	if sh.nats == 0 {
		choices = 2
	} else if pair {
		choices = 4
	}
	extra := 0
	if len(sh.agents) > 1 {
		extra = 1
	}
	n := rng.IntN(choices + extra)
	if n >= choices {
		n = 1
	}
	switch n {
	case 0:
		return []string{fmt.Sprintf("relay-%d", rng.IntN(sh.relays))}
	case 1:
		return []string{sh.agent(rng)}
	case 2:
		return []string{fmt.Sprintf("nats-%d", rng.IntN(sh.nats))}
	default:
		a := rng.IntN(sh.nats)
		b := (a + 1 + rng.IntN(sh.nats-1)) % sh.nats
		return []string{fmt.Sprintf("nats-%d", a), fmt.Sprintf("nats-%d", b)}
	}
}

// linkTarget picks a link: an agent's to one relay node, to all of them,
// or a node's to the NATS servers.
func linkTarget(rng *rand.Rand, sh shape) string {
	n := 2
	if sh.nats > 0 {
		n = 3
	}
	switch rng.IntN(n) {
	case 0:
		return fmt.Sprintf("%s->relay-%d", sh.agent(rng), rng.IntN(sh.relays))
	case 1:
		return sh.agent(rng) + "->relay"
	default:
		return fmt.Sprintf("relay-%d->nats", rng.IntN(sh.relays))
	}
}

// nemesis carries out a schedule on a topology.
type nemesis struct {
	top   *topology
	acked func(deliveryID string) bool // whether a sender has been answered 2xx for it
	log   *history.Log[history.Fault]
	start time.Time
}

// run carries out the schedule, one fault at a time, until it ends or ctx
// is done; whatever is broken then is healed before it returns.
func (n *nemesis) run(ctx context.Context, sched []fault) {
	for i, f := range sched {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(n.start.Add(f.At))):
		}
		n.top.revive()
		n.apply(ctx, i, f)
	}
}

// apply injects f, holds it, heals it and logs it with its times.
func (n *nemesis) apply(ctx context.Context, i int, f fault) {
	rec := history.Fault{Kind: f.Kind, Target: strings.Join(f.Targets, "+")}
	rec.Start = time.Now().UnixNano()
	heal, detail, err := n.inject(f)
	rec.Detail = detail
	if err != nil {
		slog.Error("nemesis: could not inject", "n", i, "kind", f.Kind, "target", rec.Target, "err", err)
		rec.Detail += "; failed: " + err.Error()
	} else {
		slog.Info("nemesis: fault", "n", i, "kind", f.Kind, "target", rec.Target, "hold", f.Hold, "detail", detail)
	}
	n.hold(ctx, i, f)
	if heal != nil {
		if more, err := heal(); err != nil {
			slog.Error("nemesis: could not heal", "n", i, "kind", f.Kind, "target", rec.Target, "err", err)
			rec.Detail += "; heal failed: " + err.Error()
		} else if more != "" {
			rec.Detail += "; " + more
		}
	}
	rec.End = time.Now().UnixNano()
	if err := n.log.Append(rec); err != nil {
		slog.Error("nemesis: cannot record a fault", "err", err)
	}
}

// hold waits out f; a disk-full with a Then has the agent killed or
// stopped in its middle third and started again on the full disk, logged
// as a fault of its own.
func (n *nemesis) hold(ctx context.Context, i int, f fault) {
	wait := func(d time.Duration) {
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
	}
	if f.Then == "" {
		wait(f.Hold)
		return
	}
	wait(f.Hold / 3)
	n.apply(ctx, i, fault{Kind: f.Then, Targets: []string{"agent"}, Hold: f.Hold / 3})
	wait(f.Hold / 3)
}

// healFunc undoes a fault and may say how it went.
type healFunc func() (string, error)

func (n *nemesis) inject(f fault) (healFunc, string, error) {
	switch f.Kind {
	case history.FaultSigkill, history.FaultSigterm, history.FaultSigstop:
		return n.signal(f)
	case history.FaultNetCut, history.FaultNetSlow, history.FaultNetDrop:
		return n.network(f)
	case history.FaultDiskFull:
		return n.diskFull(f)
	case history.FaultPowerCut:
		return n.powerCut()
	}
	return nil, "", fmt.Errorf("unknown fault %q", f.Kind)
}

// signal kills, stops or freezes the targets; healing restarts or
// continues them.
func (n *nemesis) signal(f fault) (healFunc, string, error) {
	var ps []*proc
	for _, t := range f.Targets {
		p := n.top.proc(t)
		if p == nil {
			return nil, "", fmt.Errorf("no process %s", t)
		}
		ps = append(ps, p)
	}
	switch f.Kind {
	case history.FaultSigstop:
		for _, p := range ps {
			p.signal(syscall.SIGSTOP)
		}
		return func() (string, error) {
			for _, p := range ps {
				p.signal(syscall.SIGCONT)
			}
			return "", nil
		}, "SIGSTOP, then SIGCONT", nil
	case history.FaultSigterm:
		detail := "SIGTERM, then started again"
		for _, p := range ps {
			if !p.term(stopGrace) {
				detail = fmt.Sprintf("SIGTERM; still running after %s, so SIGKILL; then started again", stopGrace)
			}
		}
		return n.restart(ps), detail, nil
	default:
		for _, p := range ps {
			p.kill()
		}
		return n.restart(ps), "SIGKILL, then started again", nil
	}
}

// stopGrace is how long a SIGTERM may take: the relay's --stop-grace
// (20 s) and some more, as a service manager allows.
const stopGrace = 30 * time.Second

func (n *nemesis) restart(ps []*proc) healFunc {
	return func() (string, error) {
		for _, p := range ps {
			if err := n.top.restart(p); err != nil {
				return "", err
			}
		}
		return "", nil
	}
}

// network breaks a link through its proxies.
func (n *nemesis) network(f fault) (healFunc, string, error) {
	link := f.Targets[0]
	var detail string
	var err error
	reset := false
	ps := n.top.proxies
	switch f.Kind {
	case history.FaultNetCut:
		if f.Param == 1 {
			detail, reset = "black hole: nothing passes, connections hang; closed when healed", true
			err = ps.toxic(link, `{"name":"cut-down","type":"timeout","stream":"downstream","attributes":{"timeout":0}}`)
			if err == nil {
				err = ps.toxic(link, `{"name":"cut-up","type":"timeout","stream":"upstream","attributes":{"timeout":0}}`)
			}
		} else {
			detail = "connections reset and refused"
			ps.disable(link)
		}
	case history.FaultNetSlow:
		detail = fmt.Sprintf("%d ms each way", f.Param)
		for _, dir := range []string{"downstream", "upstream"} {
			if err == nil {
				err = ps.toxic(link, fmt.Sprintf(`{"name":"slow-%s","type":"latency","stream":%q,"attributes":{"latency":%d,"jitter":%d}}`, dir, dir, f.Param, f.Param/10))
			}
		}
	case history.FaultNetDrop:
		detail = fmt.Sprintf("each connection cut after %d bytes each way, mid-frame", f.Param)
		for _, dir := range []string{"downstream", "upstream"} {
			if err == nil {
				err = ps.toxic(link, fmt.Sprintf(`{"name":"drop-%s","type":"limit_data","stream":%q,"attributes":{"bytes":%d}}`, dir, dir, f.Param))
			}
		}
	}
	return func() (string, error) { return "", ps.heal(link, reset) }, detail, err
}

// diskFull fills the agent's disk; healing gives the room back.
func (n *nemesis) diskFull(f fault) (healFunc, string, error) {
	d := n.top.disk
	wrote, err := d.fill(f.Param << 20)
	detail := fmt.Sprintf("ballast of %d MiB fills the agent's %s disk but %d MiB", wrote>>20, agentDiskSize, f.Param)
	if f.Then != "" {
		detail += ", and the agent gets " + f.Then + " and starts again on it"
	}
	return func() (string, error) { return "", d.free() }, detail, err
}

// powerCut kills the agent and tears its last intake record, unless that
// record was synced before the cut; healing starts it again.
func (n *nemesis) powerCut() (healFunc, string, error) {
	a := n.top.agent
	a.kill()
	// An answer the relay already had reaches its sender in moments;
	// only then does the runner know every insert that was acknowledged.
	time.Sleep(2 * time.Second)
	t, err := tearLastRecord(n.top.disk.data, n.synced)
	detail := "SIGKILL; no intake record to tear"
	if t.file != "" {
		what := map[byte]string{1: "insert", 2: "update"}[t.kind]
		detail = fmt.Sprintf("SIGKILL, then the last record of %s (an %s at offset %d, %d bytes) torn: its second half zeroed", filepath.Base(t.file), what, t.off, t.size)
		if t.kept {
			detail = fmt.Sprintf("SIGKILL; the last record of %s (an insert at offset %d) left whole: it holds a request a sender was answered 2xx for, so --sync full had synced it", filepath.Base(t.file), t.off)
		}
	}
	return n.restart([]*proc{a}), detail, err
}

// synced reports whether an intake record must have reached the disk
// before the power cut: under --sync full (the agent's default) an insert
// is synced before its request is forwarded, so an insert naming a
// delivery some sender was answered 2xx for was on disk. An update (the
// handler's answer, recorded after it) is not synced on its own, so a
// power cut may tear it.
func (n *nemesis) synced(payload []byte) bool {
	if len(payload) == 0 || payload[0] != 1 {
		return false
	}
	for _, id := range uuidRE.FindAll(payload, -1) {
		if n.acked(string(id)) {
			return true
		}
	}
	return false
}

var uuidRE = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
