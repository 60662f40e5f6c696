package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// topology is the system under test, every part a separate process on
// 127.0.0.1 so that signals are real: in team mode three NATS servers in a
// JetStream cluster, three relay nodes over it, and on one token the
// default agent and three claimant agents; in single mode one relay
// (SQLite) and the default agent (the claimants too with -claims). Each agent reaches each relay node, and each node
// each NATS server, through a proxy of its own.
type topology struct {
	mode    string
	bin     string // calltap
	natsBin string
	logs    string // folder of the processes' output
	work    string // folder of their data

	nats      []*proc
	natsURLs  []string // direct client URLs, for the token command
	natsMon   []string // monitoring URLs
	relays    []*proc
	relayURLs []string // direct, as senders reach them
	agent     *proc    // the token's default agent, with the route file, on disk
	claimants []*proc  // the claimant agents, in the order of their history.Claimant
	disk      *agentDisk
	proxies   *proxies
	token     string
	tokenFile string // the token, for the agents' --token-file
	tunnel    string
}

// processes the nemesis can aim at, by name.
func (t *topology) proc(name string) *proc {
	for _, p := range t.all() {
		if p.name == name {
			return p
		}
	}
	return nil
}

func (t *topology) all() []*proc {
	ps := append(append([]*proc{}, t.nats...), t.relays...)
	return append(ps, t.agents()...)
}

// agents are the agents started so far: the default one, then the
// claimants.
func (t *topology) agents() []*proc {
	var ps []*proc
	if t.agent != nil {
		ps = append(ps, t.agent)
	}
	return append(ps, t.claimants...)
}

func (t *topology) newProc(name, bin string, args ...string) *proc {
	return &proc{name: name, bin: bin, args: args, logf: filepath.Join(t.logs, name+".log")}
}

// startNATS starts three NATS servers routed to each other, JetStream on,
// and waits until each is healthy. no_advertise keeps the servers from
// telling clients each other's direct addresses, so that relay nodes reach
// them only through their proxies.
func (t *topology) startNATS(ctx context.Context, n int) error {
	ports, err := freePorts(3 * n)
	if err != nil {
		return err
	}
	var routes []string
	for i := range n {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", ports[n+i]))
	}
	for i := range n {
		client, route, mon := ports[i], ports[n+i], ports[2*n+i]
		var others []string
		for j, r := range routes {
			if j != i {
				others = append(others, r)
			}
		}
		name := fmt.Sprintf("nats-%d", i)
		p := t.newProc(name, t.natsBin, "-n", name, "-a", "127.0.0.1", "-p", fmt.Sprint(client), "-m", fmt.Sprint(mon),
			"-js", "-sd", filepath.Join(t.work, name), "--cluster_name", "calltap-chaos",
			"--cluster", fmt.Sprintf("nats://127.0.0.1:%d", route), "--routes", strings.Join(others, ","), "--no_advertise")
		if err := p.start(); err != nil {
			return err
		}
		t.nats = append(t.nats, p)
		t.natsURLs = append(t.natsURLs, fmt.Sprintf("nats://127.0.0.1:%d", client))
		t.natsMon = append(t.natsMon, fmt.Sprintf("http://127.0.0.1:%d/healthz", mon))
	}
	for i, u := range t.natsMon {
		if err := until(ctx, time.Minute, func() bool { return getStatus(u) == http.StatusOK }); err != nil {
			return fmt.Errorf("nats-%d did not become healthy: %w", i, err)
		}
	}
	return nil
}

// startRelays starts n relay nodes (team: over the NATS servers, each
// through its own proxies; single: one node on SQLite) and waits until each
// answers its health check. They run with calltap's defaults (the promise
// is checked as shipped) but for the rate limit, which the bursts of one
// tunnel would hit: a 429 is a documented answer, not a finding.
func (t *topology) startRelays(ctx context.Context, n int) error {
	ports, err := freePorts(n + n*len(t.natsURLs))
	if err != nil {
		return err
	}
	for i := range n {
		name := fmt.Sprintf("relay-%d", i)
		u := fmt.Sprintf("http://127.0.0.1:%d", ports[i])
		args := []string{"relay", "--listen", u[len("http://"):], "--insecure-http", "--public-url", u,
			"--data", filepath.Join(t.work, name), "--rate-limit", "0"}
		if len(t.natsURLs) > 0 {
			var via []string
			for j, nu := range t.natsURLs {
				addr, err := t.proxies.add(fmt.Sprintf("%s->nats-%d", name, j), ports[n+i*len(t.natsURLs)+j], nu[len("nats://"):])
				if err != nil {
					return err
				}
				via = append(via, "nats://"+addr)
			}
			args = append(args, "--nats", strings.Join(via, ","), "--nats-replicas", fmt.Sprint(len(t.natsURLs)), "--node", name)
		}
		p := t.newProc(name, t.bin, args...)
		if err := p.start(); err != nil {
			return err
		}
		t.relays = append(t.relays, p)
		t.relayURLs = append(t.relayURLs, u)
	}
	for i, u := range t.relayURLs {
		if err := until(ctx, 2*time.Minute, func() bool { return getStatus(u+"/healthz") == http.StatusOK }); err != nil {
			return fmt.Errorf("relay-%d did not come up: %w (see %s)", i, err, t.relays[i].logf)
		}
	}
	return nil
}

// createToken makes the developer's token with `calltap relay token create`
// and writes it where the agents read it.
func (t *topology) createToken(ctx context.Context) error {
	args := []string{"relay", "token", "create", "chaos", "--json"}
	if len(t.natsURLs) > 0 {
		args = append(args, "--nats", strings.Join(t.natsURLs, ","), "--nats-replicas", fmt.Sprint(len(t.natsURLs)))
	} else {
		args = append(args, "--data", filepath.Join(t.work, "relay-0"), "--public-url", t.relayURLs[0])
	}
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(ctx, t.bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("calltap relay token create: %w: %s", err, errOut.String())
	}
	var tok struct {
		Token    string `json:"token"`
		TunnelID string `json:"tunnel_id"`
	}
	if err := json.Unmarshal(out.Bytes(), &tok); err != nil || tok.TunnelID == "" {
		return fmt.Errorf("calltap relay token create printed %q", out.String())
	}
	t.token, t.tunnel = tok.Token, tok.TunnelID
	// Written once, before any agent reads it: one agent starting must
	// not find it half written by another's start.
	t.tokenFile = filepath.Join(t.work, "token")
	return os.WriteFile(t.tokenFile, []byte(t.token), 0o600)
}

// agentSpec is one `calltap listen` of the run.
type agentSpec struct {
	name      string // its process: "agent" for the default one, history.ClaimantProc for a claimant
	data      string // its --data
	forwardTo string
	routes    string // its route file; "" for none
	claim     string // its --claim; "" for the default agent
}

// startAgent starts `calltap listen` as a says, reaching every relay node
// through a proxy of its own.
func (t *topology) startAgent(a agentSpec) (*proc, error) {
	ports, err := freePorts(len(t.relayURLs))
	if err != nil {
		return nil, err
	}
	var via []string
	for i, u := range t.relayURLs {
		addr, err := t.proxies.add(fmt.Sprintf("%s->relay-%d", a.name, i), ports[i], u[len("http://"):])
		if err != nil {
			return nil, err
		}
		via = append(via, "http://"+addr)
	}
	args := []string{"listen", "--relay", strings.Join(via, ","), "--token-file", t.tokenFile,
		"--forward-to", a.forwardTo, "--inspect", "", "--data", a.data, "--quiet"}
	if a.routes != "" {
		args = append(args, "--routes", a.routes)
	}
	if a.claim != "" {
		args = append(args, "--claim", a.claim)
	}
	p := t.newProc(a.name, t.bin, args...)
	return p, p.start()
}

// agentsUp reports whether the relay holds every agent: the nodes hold
// as many agents between them as were started, and every node knows every
// claimant's seat, so that no call of a claimant goes to the default agent
// for want of a node that has not heard of the claim yet.
func (t *topology) agentsUp(claims []string) bool {
	held := 0
	for _, u := range t.relayURLs {
		m := getBody(u + "/metrics")
		for _, c := range claims {
			if !strings.Contains(m, fmt.Sprintf("claims=%q}", c)) {
				return false
			}
		}
		held += gauge(m, "calltap_tunnels_connected")
	}
	return held >= len(t.agents())
}

// gauge reads an unlabelled gauge of a /metrics page; 0 if it has none.
func gauge(page, name string) int {
	for _, line := range strings.Split(page, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	return 0
}

// restart starts p again and checks that it stays up for a moment: a
// process that refuses to start (a store it cannot open) is reported with
// the last lines of its output.
func (t *topology) restart(p *proc) error {
	if err := p.start(); err != nil {
		return err
	}
	if p.wait(3 * time.Second) {
		return fmt.Errorf("%s exited at start (%v): %s", p.name, p.exitErr(), cause(p.logf))
	}
	return nil
}

// revive starts again any process that died on its own (not by the
// nemesis, which restarts what it kills), and continues any left frozen.
func (t *topology) revive() {
	for _, p := range t.all() {
		if p.running() {
			continue
		}
		slog.Warn("process found dead; starting it again", "proc", p.name, "exit", p.exitErr(), "output", tail(p.logf, 3))
		if err := t.restart(p); err != nil {
			slog.Error("process cannot be started again", "proc", p.name, "err", err)
		}
	}
}

// stopAll stops every process: the agents first, in order (their
// undelivered captures stay on their disks), then the relays and the NATS
// servers.
func (t *topology) stopAll() {
	for _, a := range t.agents() {
		a.term(stopGrace)
	}
	for _, p := range t.all() {
		p.kill()
	}
}

// cause is why a process that just exited said it stopped: the last line
// of its output that calltap's fatal errors start with ("calltap listen:
// …"), else its last lines (warnings that come before, such as media
// downloads refused, are not the cause).
func cause(path string) string {
	lines := strings.Split(tail(path, 20), " | ")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.HasPrefix(lines[i], "calltap ") {
			return lines[i]
		}
	}
	return tail(path, 3)
}

// tail is the last n lines of a log file, on one line.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// until polls ok every 100 ms until it holds, ctx ends or d passes.
func until(ctx context.Context, d time.Duration, ok func() bool) error {
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %s", d)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

var probe = &http.Client{Timeout: 2 * time.Second}

func getStatus(url string) int {
	resp, err := probe.Get(url)
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func getBody(url string) string {
	resp, err := probe.Get(url)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}
