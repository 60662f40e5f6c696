package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/calltap/calltap/scripts/benchrun/load"
	"github.com/nats-io/nats-server/v2/server"
)

// cmdCluster measures a team relay: three NATS servers with JetStream (in
// this process, routed on loopback, R3) and three `calltap relay --nats`
// processes. The agent connects to node 0; the same 2 KB event is posted
// to node 0 (its own node) and to node 1 (forwarded over NATS), in
// alternating rounds. Then the agent leaves, senders post to all three
// nodes, and the agent comes back to node 2 to drain the shared queue.
// The NATS servers count the bytes of every connection: the relays'
// traffic per request, and the servers' own (replication) beside it.
func cmdCluster(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("cluster", flag.ContinueOnError)
	bin := fs.String("bin", "bin/calltap", "the calltap binary")
	out := fs.String("out", "", "results file")
	rounds := fs.Int("rounds", 2, "alternating rounds of same-node and cross-node load")
	dur := fs.Duration("duration", 3*time.Second, "measured time of each run")
	warm := fs.Duration("warmup", time.Second, "unmeasured time before each run")
	queueDur := fs.Duration("queue-duration", 2*time.Second, "how long senders post while the agent is away")
	if err := fs.Parse(args); err != nil {
		return err
	}
	pt, err := openPart(*out, "", "cluster")
	if err != nil {
		return err
	}
	defer pt.close()
	cb := &clusterBench{bin: *bin, dir: pt.dir, res: pt.res, hp: pt.hp, hurl: pt.hurl, rounds: *rounds, dur: *dur, warm: *warm, queueDur: *queueDur}
	defer cb.stop()
	if err := cb.start(ctx); err != nil {
		return err
	}
	cb.ev, cb.stamp = jsonEvent2K()
	if err := cb.measureLoad(ctx); err != nil {
		return err
	}
	if err := cb.measureEnqueue(ctx); err != nil {
		return err
	}
	return cb.measureDrain(ctx)
}

// clusterBench is one run of cmdCluster: its processes and its settings.
type clusterBench struct {
	bin, dir            string
	res                 *results
	rounds              int
	dur, warm, queueDur time.Duration
	ev                  []byte
	stamp               int
	nats                *natsCluster
	hp                  *proc
	hurl                string
	nodes               []*calltap
	stops               []func()
	depth               float64 // requests held while the agent was away
}

func (cb *clusterBench) stop() {
	for i := len(cb.stops) - 1; i >= 0; i-- {
		cb.stops[i]()
	}
}

// start starts three NATS servers, the handler, three relay nodes and the
// agent on node 0, and waits until every node knows where the agent is.
func (cb *clusterBench) start(ctx context.Context) error {
	nats, err := startNATS(cb.dir, 3)
	if err != nil {
		return err
	}
	cb.nats = nats
	cb.stops = append(cb.stops, nats.shutdown)
	for i := range 3 {
		name := fmt.Sprintf("n%d", i)
		// Each node is given its own NATS server, as when one runs on each
		// relay machine (the client learns the others from it): a request
		// across nodes then crosses the servers' routes too.
		ct, err := newNode(cb.bin, filepath.Join(cb.dir, name), cb.hurl, append(relayFlagsNoLimits,
			"--nats", "nats://"+nats.servers[i].Addr().String(), "--nats-replicas", "3", "--node", name, "--queue-max-count", "1000000")...)
		if err != nil {
			return err
		}
		cb.stops = append(cb.stops, ct.stop)
		if err := ct.startRelay(ctx); err != nil {
			return err
		}
		cb.nodes = append(cb.nodes, ct)
	}
	// One token, in the shared bucket: every node serves its URL.
	if err := cb.nodes[0].createToken(ctx, "--nats", nats.urls()); err != nil {
		return err
	}
	for _, n := range cb.nodes[1:] {
		n.token, n.tunnelPath = cb.nodes[0].token, cb.nodes[0].tunnelPath
	}
	if err := cb.nodes[0].startAgent(ctx, true); err != nil {
		return err
	}
	// Every node must know where the agent is before its load begins.
	for _, n := range cb.nodes[1:] {
		if err := poll(ctx, 10*time.Second, 5*time.Millisecond, "node "+n.relayURL+" did not learn which node holds the agent", n.answers); err != nil {
			return err
		}
	}
	return nil
}

// answers reports whether the node's tunnel URL reaches the agent.
func (ct *calltap) answers() bool {
	resp, err := httpc.Post(ct.relayURL+ct.tunnelPath+"/voice", "application/json", strings.NewReader("{}"))
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == 204 || resp.StatusCode == 200
}

// clusterCell is one load of measureLoad: a node and a concurrency.
type clusterCell struct {
	name    string
	node    int
	conns   int
	r       load.Result
	traffic natsTraffic
}

// measureLoad posts the same event to the agent's node and to another, in
// alternating rounds, and adds their rows.
func (cb *clusterBench) measureLoad(ctx context.Context) error {
	var cells []*clusterCell
	for _, conns := range []int{1, 32} {
		cells = append(cells, &clusterCell{name: "same node", node: 0, conns: conns}, &clusterCell{name: "across nodes", node: 1, conns: conns})
	}
	for round := range cb.rounds {
		for i := range cells {
			c := cells[i]
			if round%2 == 1 { // alternate the order, so drift is shared
				c = cells[len(cells)-1-i]
			}
			fmt.Fprintf(os.Stderr, "cluster: round %d/%d  c=%-2d %s\n", round+1, cb.rounds, c.conns, c.name)
			if err := cb.load(ctx, c); err != nil {
				return err
			}
		}
	}
	for k := 0; k < len(cells); k += 2 { // pairs: same node, across nodes
		cb.addLoadRows(cells[k], cells[k+1])
	}
	return nil
}

func (cb *clusterBench) load(ctx context.Context, c *clusterCell) error {
	n := cb.nodes[c.node]
	u, _ := url.Parse(n.relayURL)
	var t0, t1 natsTraffic
	r, err := load.Run(ctx, load.Spec{Addr: u.Host, Path: n.tunnelPath + "/voice", Body: cb.ev, Stamp: cb.stamp,
		ContentType: "application/json", Conns: c.conns, Warmup: cb.warm, Duration: cb.dur,
		OnStart: func() { t0 = cb.nats.traffic() },
		OnEnd:   func() { t1 = cb.nats.traffic() }})
	if err != nil {
		return err
	}
	c.r.Merge(r)
	c.traffic = c.traffic.add(t1.sub(t0))
	return nil
}

// addLoadRows adds the rows of one concurrency: the table's columns
// compare direct with calltap; here both sides are calltap, so each row
// says which is which.
func (cb *clusterBench) addLoadRows(same, cross *clusterCell) {
	m := fmt.Sprintf("Team relay, 2 KB events, c=%d", same.conns)
	cb.res.add(row{Measure: m + ": requests/s",
		Calltap: fmt.Sprintf("agent's node %s%s, another node %s%s (%.2f×)", fmtRate(same.r.Rate(), "/s"), failed(same.r),
			fmtRate(cross.r.Rate(), "/s"), failed(cross.r), cross.r.Rate()/same.r.Rate())})
	cb.res.add(row{Measure: m + ": latency p50 / p99",
		Calltap: fmt.Sprintf("agent's node %s / %s, another node %s / %s (%s / %s)",
			fmtDur(same.r.Pct(50)), fmtDur(same.r.Pct(99)), fmtDur(cross.r.Pct(50)), fmtDur(cross.r.Pct(99)),
			fmtDelta(cross.r.Pct(50)-same.r.Pct(50)), fmtDelta(cross.r.Pct(99)-same.r.Pct(99)))})
	if same.conns == 32 {
		cb.res.add(row{Measure: "Team relay: NATS traffic per request (relays ↔ NATS; between NATS servers)",
			Calltap: "agent's node " + same.traffic.perRequest(same.r.N) + ", another node " + cross.traffic.perRequest(cross.r.N)})
	}
}

// measureEnqueue measures the queue across nodes: the agent away, each
// node takes a third of the senders.
func (cb *clusterBench) measureEnqueue(ctx context.Context) error {
	cb.nodes[0].agent.stop()
	if err := poll(ctx, 10*time.Second, 5*time.Millisecond, "the agent's node did not see it leave", func() bool {
		v, err := cb.nodes[0].relayMetric("calltap_tunnels_connected")
		return err == nil && v == 0
	}); err != nil {
		return err
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var enq load.Result
	var loadErr error
	t0 := cb.nats.traffic()
	for _, n := range cb.nodes {
		u, _ := url.Parse(n.relayURL)
		wg.Go(func() {
			r, err := load.Run(ctx, load.Spec{Addr: u.Host, Path: n.tunnelPath + "/voice", Body: cb.ev, Stamp: cb.stamp, ContentType: "application/json",
				Conns: 11, Warmup: 300 * time.Millisecond, Duration: cb.queueDur})
			mu.Lock()
			defer mu.Unlock()
			enq.Merge(r)
			loadErr = errors.Join(loadErr, err)
		})
	}
	wg.Wait()
	if loadErr != nil {
		return loadErr
	}
	enqTraffic := cb.nats.traffic().sub(t0)
	enqRow := row{Measure: "Team relay: enqueue with the agent away, senders on all three nodes (2 KB, c=33; stored R3 in JetStream, 202)",
		Calltap: fmtRate(float64(enq.N)/cb.queueDur.Seconds(), "/s") + fmt.Sprintf(", p50 %s, p99 %s, NATS traffic %s per request",
			fmtDur(enq.Pct(50)), fmtDur(enq.Pct(99)), enqTraffic.perRequest(enq.N))}
	if enq.Statuses[202] != enq.N {
		enqRow.Calltap += fmt.Sprintf(" (%d not 202)", enq.N-enq.Statuses[202])
	}
	cb.res.add(enqRow)
	return cb.settleDepth(ctx)
}

// settleDepth waits until the shared queue's depth holds still.
func (cb *clusterBench) settleDepth(ctx context.Context) error {
	return poll(ctx, 30*time.Second, 10*time.Millisecond, "the shared queue's depth did not settle", func() bool {
		v, err := cb.nodes[2].relayMetric("calltap_cluster_queue_depth")
		if err == nil && v > 0 && v == cb.depth {
			return true
		}
		cb.depth = v
		return false
	})
}

// measureDrain brings the agent back on node 2 and times the drain of the
// shared queue.
func (cb *clusterBench) measureDrain(ctx context.Context) error {
	before, err := handlerCount(cb.hurl)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "cluster: %d requests held in the stream; the agent comes back on node 2\n", int(cb.depth))
	back := cb.nodes[2]
	back.dir = cb.nodes[0].dir // the same agent store, as a developer's laptop
	t1 := time.Now()
	if err := back.startAgent(ctx, false); err != nil {
		return err
	}
	var tConnected, tDrained time.Duration
	if err := poll(ctx, 10*time.Minute, 5*time.Millisecond, "the shared queue did not drain", func() bool {
		if tConnected == 0 {
			if v, err := back.relayMetric("calltap_tunnels_connected"); err == nil && v > 0 {
				tConnected = time.Since(t1)
			}
			return false
		}
		n, err := handlerCount(cb.hurl)
		if err == nil && float64(n-before) >= cb.depth {
			tDrained = time.Since(t1)
			return true
		}
		return false
	}); err != nil {
		return err
	}
	cb.res.add(row{Measure: fmt.Sprintf("Team relay: drain of the shared queue, %s held (queued on three nodes) → delivered via node 2, in order", fmtCount(int(cb.depth))),
		Calltap: fmtRate(cb.depth/(tDrained-tConnected).Seconds(), "/s") + " (" + fmtDur(tDrained-tConnected) + " after connecting)"})
	return nil
}

// natsCluster is n NATS servers with JetStream, routed to each other on
// loopback, in this process.
type natsCluster struct {
	servers []*server.Server
}

func startNATS(dir string, n int) (*natsCluster, error) {
	// JetStream's cluster wants every route from the start: the route
	// ports are chosen before any server starts.
	routes := make([]int, n)
	for i := range routes {
		p, err := freePort()
		if err != nil {
			return nil, err
		}
		routes[i] = p
	}
	c := &natsCluster{}
	for i := range n {
		o := &server.Options{
			ServerName: fmt.Sprintf("nats-%d", i),
			Host:       "127.0.0.1",
			Port:       server.RANDOM_PORT,
			JetStream:  true,
			StoreDir:   filepath.Join(dir, fmt.Sprintf("nats-%d", i)),
			NoSigs:     true,
			NoLog:      true,
			Cluster:    server.ClusterOpts{Name: "calltap-bench", Host: "127.0.0.1", Port: routes[i]},
		}
		for j, rp := range routes {
			if j != i {
				o.Routes = append(o.Routes, &url.URL{Scheme: "nats", Host: fmt.Sprintf("127.0.0.1:%d", rp)})
			}
		}
		s, err := server.NewServer(o)
		if err != nil {
			c.shutdown()
			return nil, err
		}
		go s.Start()
		if !s.ReadyForConnections(10 * time.Second) {
			c.shutdown()
			return nil, fmt.Errorf("NATS server %d did not start", i)
		}
		c.servers = append(c.servers, s)
	}
	return c, nil
}

func (c *natsCluster) urls() string {
	var us []string
	for _, s := range c.servers {
		us = append(us, "nats://"+s.Addr().String())
	}
	return strings.Join(us, ",")
}

func (c *natsCluster) shutdown() {
	for _, s := range c.servers {
		s.Shutdown()
	}
}

// natsTraffic is what the servers counted: bytes to and from the relays'
// connections, and between the servers themselves (routes: replication,
// forwarding between servers).
type natsTraffic struct {
	relays, routes int64
}

func (c *natsCluster) traffic() natsTraffic {
	var t natsTraffic
	for _, s := range c.servers {
		if cz, err := s.Connz(&server.ConnzOptions{Limit: 1000}); err == nil {
			for _, ci := range cz.Conns {
				if strings.HasPrefix(ci.Name, "calltap relay ") {
					t.relays += ci.InBytes + ci.OutBytes
				}
			}
		}
		if rz, err := s.Routez(nil); err == nil {
			for _, ri := range rz.Routes {
				// Each route is counted by both its servers: half here.
				t.routes += (ri.InBytes + ri.OutBytes) / 2
			}
		}
	}
	return t
}

func (t natsTraffic) sub(o natsTraffic) natsTraffic {
	return natsTraffic{t.relays - o.relays, t.routes - o.routes}
}

func (t natsTraffic) add(o natsTraffic) natsTraffic {
	return natsTraffic{t.relays + o.relays, t.routes + o.routes}
}

func (t natsTraffic) perRequest(n int) string {
	n = max(n, 1)
	return fmtBytes(float64(t.relays)/float64(n)) + "; " + fmtBytes(float64(t.routes)/float64(n))
}
