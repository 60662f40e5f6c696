package cluster_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/calltap/calltap/relay"
	"github.com/calltap/calltap/relay/cluster/natstest"
	"github.com/calltap/calltap/relay/polltest"
)

// The node holding the agent frozen (SIGSTOP) past the time the other
// nodes wait for it: their senders are answered 503 and retry; when the
// node wakes, it finds the forwards it was sent while frozen, and neither
// delivers nor queues one: each had its answer already. 3 rounds: in the
// first two the agent waits for the node, in the last it leaves for the
// other node (the woken node would queue what it finds).
func TestFrozenHolderDeliversNoLateCopy(t *testing.T) {
	nats := natstest.Start(t, 3)
	holder := startNodeProcess(t, nats.URLs(), "holder")
	f := startNode(t, nats, "f", nil)
	info := token(t, f, "alice")
	l := newLedger()
	startAgentAt(t, t.TempDir(), info.Token, startLedgerHandler(t, l), holder.URL+","+f.URL, nil)
	path := "/t/" + info.TunnelID
	// Past the 3 s another node waits for a word from the holder; the
	// agent's keepalive allows 6 s.
	for round, freeze := range []time.Duration{4500 * time.Millisecond, 4500 * time.Millisecond, 8 * time.Second} {
		polltest.Until(t, 30*time.Second, func() bool { return f.c.Holder(info.TunnelID).Node != "" }, "no node holds the agent")
		if f.c.Holder(info.TunnelID).Node != "holder" {
			t.Fatalf("round %d: the agent left the holder; nothing to freeze", round)
		}
		holder.freeze()
		thawed := make(chan struct{})
		time.AfterFunc(freeze, func() { holder.thaw(); close(thawed) })
		var senders sync.WaitGroup
		for i := range 8 {
			senders.Go(func() { l.send(t, []string{f.URL}, path, fmt.Sprintf("r%d_%d", round, i)) })
		}
		senders.Wait()
		<-thawed
		l.settle(t, []string{f.URL}, path, fmt.Sprintf("r%d_marker", round))
	}
	l.check(t)
}

// A NATS server frozen (SIGSTOP) while a node forwards requests through
// it: that node's senders are answered 503 and retry, and what the server
// held when it froze reaches the holding node when it wakes, after the
// retries. None of it reaches the handler. 3 rounds, each with a new
// forwarding node on the server (the last one has moved to another).
func TestFrozenNATSServerDeliversNoLateCopy(t *testing.T) {
	nats := natstest.StartProcesses(t, 3)
	urls := strings.Split(nats.URLs(), ",")
	// Each node is given one server; it learns the others from it.
	holder, _ := startNodeOver(t, "holder", urls[0])
	info := token(t, holder, "alice")
	l := newLedger()
	startAgentAt(t, t.TempDir(), info.Token, startLedgerHandler(t, l), holder.URL, nil)
	path := "/t/" + info.TunnelID
	for round := range 3 {
		f, _ := startNodeOver(t, fmt.Sprintf("f%d", round), urls[1])
		waitHeld(t, info, holder, f)
		nats.Freeze(1)
		thawed := make(chan struct{})
		time.AfterFunc(4500*time.Millisecond, func() { nats.Thaw(1); close(thawed) })
		var senders sync.WaitGroup
		for i := range 8 {
			senders.Go(func() { l.send(t, []string{f.URL}, path, fmt.Sprintf("r%d_%d", round, i)) })
		}
		senders.Wait()
		<-thawed
		l.settle(t, []string{f.URL}, path, fmt.Sprintf("r%d_marker", round))
		f.stop()
	}
	l.check(t)
}

// A NATS server frozen while a node queues requests through it (no agent
// is connected): a request whose sender was answered 503, because the
// stream's ack did not come in time, is never delivered, though the server
// stores what it held when it wakes. 3 rounds, each with a new node on the
// server, then the agent connects and drains the queue.
func TestFrozenNATSServerQueuesNoLateCopy(t *testing.T) {
	nats := natstest.StartProcesses(t, 3)
	urls := strings.Split(nats.URLs(), ",")
	var info *relay.TokenInfo
	l := newLedger()
	for round := range 3 {
		q, _ := startNodeOver(t, fmt.Sprintf("q%d", round), urls[1])
		if info == nil {
			info = token(t, q, "alice")
		}
		nats.Freeze(1)
		thawed := make(chan struct{})
		time.AfterFunc(4500*time.Millisecond, func() { nats.Thaw(1); close(thawed) })
		var senders sync.WaitGroup
		for i := range 8 {
			senders.Go(func() { l.send(t, []string{q.URL}, "/t/"+info.TunnelID, fmt.Sprintf("r%d_%d", round, i)) })
		}
		senders.Wait()
		<-thawed
		q.stop()
	}
	n, _ := startNodeOver(t, "n", urls[0])
	startAgentAt(t, t.TempDir(), info.Token, startLedgerHandler(t, l), n.URL, nil)
	for round := range 3 {
		for i := range 8 {
			id := fmt.Sprintf("r%d_%d", round, i)
			polltest.Until(t, 30*time.Second, func() bool { return l.reached(id) }, id+", queued, did not reach the handler")
		}
	}
	l.settle(t, []string{n.URL}, "/t/"+info.TunnelID, "marker")
	l.check(t)
}
