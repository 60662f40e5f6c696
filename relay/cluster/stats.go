// A node's view of the cluster for /metrics, kept current in the
// background: a scrape reads what was last seen and never waits on NATS.

package cluster

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/calltap/calltap/relay"
	"github.com/nats-io/nats.go/jetstream"
)

// statsEvery is how often the stats are read from NATS; a reading older
// than statsStale counts NATS as away.
const (
	statsEvery = time.Second
	statsStale = 3 * statsEvery
)

type statsCache struct {
	l      *link
	stream jetstream.Stream
	// after is called with each reading of the stream's depth.
	after func(ctx context.Context, queued uint64)
	quit  chan struct{}
	done  chan struct{}

	mu     sync.Mutex
	last   relay.ClusterStats // guarded by mu; Queued stays what it was while NATS is away
	seenAt time.Time          // guarded by mu; when NATS last answered
}

func startStats(l *link, stream jetstream.Stream, after func(context.Context, uint64)) *statsCache {
	s := &statsCache{l: l, stream: stream, after: after, quit: make(chan struct{}), done: make(chan struct{})}
	s.refresh()
	go s.loop()
	return s
}

func (s *statsCache) loop() {
	defer close(s.done)
	t := time.NewTicker(statsEvery)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			s.refresh()
		case <-s.quit:
			return
		}
	}
}

func (s *statsCache) refresh() {
	if !s.l.nc.IsConnected() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.l.timeout)
	defer cancel()
	start := time.Now()
	if err := s.l.nc.FlushWithContext(ctx); err != nil {
		return
	}
	rtt := time.Since(start)
	// The stream's own count: the same on every node.
	info, err := s.stream.Info(ctx)
	if err != nil {
		return
	}
	s.mu.Lock()
	s.last = relay.ClusterStats{RTT: rtt, Queued: info.State.Msgs}
	s.seenAt = time.Now()
	s.mu.Unlock()
	s.after(ctx, info.State.Msgs)
}

// findQueued wakes the drain of each tunnel held here that has requests
// in the stream. A kick is a core-NATS message, lost if a connection
// blinks as it goes: without this look, a request whose kick was lost
// would wait for the next one, and live requests would pass it meanwhile.
// It costs one read of the stream's per-tunnel counts a second, and only
// while something is queued and this node holds an agent.
func (c *Cluster) findQueued(ctx context.Context, queued uint64) {
	c.holders.mu.Lock()
	held := len(c.holders.mine) > 0
	kicked := c.kicked
	c.holders.mu.Unlock()
	if queued == 0 || !held || kicked == nil {
		return
	}
	counts, err := c.queueStats(ctx, subjectQueue+"*")
	if err != nil {
		return
	}
	var wake []string
	c.holders.mu.Lock()
	for id, st := range counts {
		if _, mine := c.holders.mine[id]; mine && st.Count > 0 {
			wake = append(wake, id)
		}
	}
	c.holders.mu.Unlock()
	for _, id := range wake {
		kicked(id)
	}
}

func (s *statsCache) stop() {
	close(s.quit)
	<-s.done
}

// Stats are a node's view of the cluster, for /metrics: what was last
// read, and an error while NATS is away (the queue depth is then the last
// one seen).
func (c *Cluster) Stats(context.Context) (relay.ClusterStats, error) {
	s := c.stats
	s.mu.Lock()
	defer s.mu.Unlock()
	if !c.nc.IsConnected() || time.Since(s.seenAt) > statsStale {
		return s.last, errNATSAway
	}
	return s.last, nil
}

var errNATSAway = errors.New("cluster: NATS has not answered in the last seconds")
