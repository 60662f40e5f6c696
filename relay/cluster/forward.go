// Requests between nodes: Forward on the node a sender reached, Serve on
// the node holding the agent.
//
// The exchange is a message to calltap.node.<node>.forward with a reply
// inbox. The holding node takes a request in two steps, so that a request
// whose sender was told to retry never reaches the handler but through
// that retry:
//
//  1. It claims the request at once: an empty progress message
//     (hdrProgress) whose reply subject is an inbox of its own.
//  2. The forwarding node, if it still waits, answers the claim with a go
//     carrying a budget (hdrBudget): how long it waits, at least, from
//     the moment it sends the go. The holding node delivers or queues the
//     request only within that budget, counted on its own monotonic clock
//     from when it sent the claim, which was before the go was sent: its
//     time runs out no later than the forwarding node's, whatever the
//     clocks of the two machines say, and however long either message
//     spent in a frozen node or NATS server.
//
// A forwarding node that has given up sends no go, and the claim finds
// nobody listening: a forward read late, by a node that was frozen or
// through a NATS server that was, is dropped. Once it has the go the
// holding node says it is still at work every progressEvery, and last
// sends the answer. The forwarding node so tells a node that is frozen,
// or whose NATS server is, from a handler that takes its time: silence for
// progressSilence ends the wait with an error its sender is told to retry,
// instead of the whole forward timeout. Silence after the go says the
// request may have reached the handler (relay.ErrAnswerLost).

package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/calltap/calltap/relay"
	"github.com/calltap/calltap/relay/api"
	"github.com/calltap/calltap/relay/wire"
	"github.com/nats-io/nats.go"
)

const (
	hdrProgress = "Calltap-Progress" // a reply that only says the request is at work
	hdrBudget   = "Calltap-Budget"   // ms: on a forward, how long its node waits for the claim; on a go, for the answer to start
	hdrStatus   = "Status"           // NATS's own: "503" when no node subscribes
)

// progressEvery is how often a holding node says it is still at a
// request; progressSilence how long a forwarding node waits for a word
// before it takes the holding node for frozen.
const (
	progressEvery   = time.Second
	progressSilence = 3 * time.Second
)

// errHolderSilent is Forward's error when the holding node stopped
// answering: the sender is told to retry.
var errHolderSilent = errors.New("cluster: the node holding the agent stopped answering")

// Forward hands req to node and waits for its answer.
func (c *Cluster) Forward(ctx context.Context, node, tunnelID string, req *wire.Request) (*wire.Answer, error) {
	if err := c.connected(ctx); err != nil {
		return nil, err
	}
	defer c.stalled("the answer of another relay node", "node", node, "tunnel", tunnelID, "request", req.ID)()
	m := nats.NewMsg(nodeSubject(node))
	m.Header.Set(hdrTunnel, tunnelID)
	out := *req
	if len(req.Body) > c.bodies.maxInline {
		offer, err := c.offerBody(m, req.Body)
		if err != nil {
			return nil, fmt.Errorf("offer the body: %w", err)
		}
		defer offer.stop()
		out.Body = nil
	}
	m.Data = wire.AppendForward(nil, &out)
	m.Header.Set(hdrBudget, strconv.FormatInt(progressSilence.Milliseconds(), 10))
	m.Reply = c.nc.NewInbox()
	replies, err := c.nc.SubscribeSync(m.Reply)
	if err != nil {
		return nil, err
	}
	defer replies.Unsubscribe()
	if err := c.nc.PublishMsg(m); err != nil {
		return nil, err
	}
	reply, err := c.awaitAnswer(ctx, replies)
	if errors.Is(err, relay.ErrNodeGone) {
		// Gone only once its lease has lapsed: until then it may deliver
		// live, and a request queued here would come behind those.
		return nil, c.lease.gone(ctx, node)
	}
	if err != nil {
		return nil, err
	}
	a, err := wire.DecodeAnswer(reply.Data)
	if err != nil {
		return nil, fmt.Errorf("answer of node %s: %w (%w)", node, relay.ErrAnswerLost, err)
	}
	if body, ok, err := c.fetchBody(ctx, reply.Header); err != nil {
		return nil, fmt.Errorf("answer body of node %s: %w (%w)", node, relay.ErrAnswerLost, err)
	} else if ok {
		a.Body = body
	}
	return a, nil
}

// awaitAnswer reads replies until the answer, skipping progress and
// answering the claim with a go, and fails after progressSilence without
// a word.
func (c *Cluster) awaitAnswer(ctx context.Context, replies *nats.Subscription) (*nats.Msg, error) {
	went := false // the go is sent: the holding node may deliver the request
	for {
		wctx, cancel := context.WithTimeout(ctx, progressSilence)
		reply, err := replies.NextMsgWithContext(wctx)
		cancel()
		switch {
		case err != nil:
			return nil, awaitError(ctx, err, went)
		case reply.Header.Get(hdrStatus) == "503" && len(reply.Data) == 0:
			// Nobody subscribes to that node's subject: it stopped or
			// died. The holder entry stays as it is: only the holder or
			// a node taking over changes it.
			return nil, relay.ErrNodeGone
		case reply.Header.Get(hdrProgress) != "" && reply.Reply != "" && !went:
			// The claim: this node still waits, and goes on waiting
			// progressSilence from now, the budget it gives.
			if err := c.sendGo(ctx, reply.Reply); err != nil {
				return nil, err
			}
			went = true
			continue
		case reply.Header.Get(hdrProgress) != "":
			continue
		}
		return reply, nil
	}
}

// awaitError is what awaitAnswer's failed read means for the sender:
// silence after the go may hide an answer (the request may have reached
// the handler), silence before it does not.
func awaitError(ctx context.Context, err error, went bool) error {
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.Is(err, context.DeadlineExceeded) && went:
		return relay.ErrAnswerLost
	case errors.Is(err, context.DeadlineExceeded):
		return errHolderSilent
	case errors.Is(err, nats.ErrNoResponders):
		// nats.go reads the server's 503 status into this error.
		return relay.ErrNodeGone
	}
	return err
}

// sendGo lets the holding node take the request: within the budget, which
// is no longer than this node will wait for its next word.
func (c *Cluster) sendGo(ctx context.Context, subject string) error {
	budget := progressSilence
	if d, ok := ctx.Deadline(); ok {
		budget = min(budget, time.Until(d))
	}
	g := nats.NewMsg(subject)
	g.Header.Set(hdrBudget, strconv.FormatInt(budget.Milliseconds(), 10))
	return c.nc.PublishMsg(g)
}

// Kick tells the node holding tunnelID that its queue grew, and returns
// once that node has counted the queue again (relay.Cluster). The holder is
// read from the bucket's stream leader, after the request was stored: the
// mirror may not have heard of an agent that reached another node a moment
// ago (chaos run, team seed 3301: a live request sent after a 202 reached
// the handler before the queued one, which waited for the kick). Only a
// node that queued a request pays the two round trips; live forwarding
// none.
func (c *Cluster) Kick(ctx context.Context, tunnelID string) error {
	// Two operations' worth, as for the store.
	ctx, cancel := context.WithTimeout(ctx, 2*c.timeout)
	defer cancel()
	node, err := c.holderNow(ctx, tunnelID)
	switch {
	case err != nil:
		c.kickAll(tunnelID)
		return fmt.Errorf("read which node holds the tunnel: %w", err)
	case node == "":
		// Nobody holds it: the node an agent reaches next counts the
		// queue once its hold is stored, which is after this read.
		return nil
	case node == c.node:
		// An agent is taking the tunnel here: its hold is stored, and it
		// has not counted yet, or it holds it by now.
		c.holders.mu.Lock()
		kicked := c.kicked
		c.holders.mu.Unlock()
		if kicked != nil {
			kicked(tunnelID)
		}
		return nil
	}
	m := nats.NewMsg(kickSubject(node))
	m.Header.Set(hdrTunnel, tunnelID)
	_, err = c.nc.RequestMsgWithContext(ctx, m)
	if err != nil {
		// A holder of an older calltap hears only the kick to every
		// node; one cut off learns of the queue when it counts again
		// (its drain, its lease regained, findQueued).
		c.kickAll(tunnelID)
	}
	if errors.Is(err, nats.ErrNoResponders) {
		// Gone (its requests are queued because it is: ErrNodeGone), or
		// of an older calltap, which the kick to every node reaches:
		// nobody to wait for.
		return nil
	}
	if err != nil {
		return fmt.Errorf("tell node %s: %w", node, err)
	}
	return nil
}

// kickAll tells every node that tunnelID's queue grew, and waits for none.
func (c *Cluster) kickAll(tunnelID string) {
	if err := c.nc.Publish(subjectKick+tunnelID, nil); err != nil {
		// The holder finds the queue anyway when it next looks (its drain
		// recounts a queue it believes empty): a lost kick costs time only.
		c.log.Warn("tell the holding node its queue grew", "tunnel", tunnelID, "err", err)
	}
}

// serving is what Serve has under way.
type serving struct {
	handling sync.WaitGroup // forwards being answered
}

// Serve answers forwards and kicks for this node until ctx ends. Then it
// stops taking forwards, answers those that reached it already (NATS
// hands them over from the subscription's buffer: none is dropped), and
// returns once each has its answer: the first two stages of a node's stop.
// The agents are still here meanwhile.
func (c *Cluster) Serve(ctx context.Context, h relay.NodeHandlers) error {
	c.holders.mu.Lock()
	c.takenOver, c.kicked = h.TakenOver, h.Kicked
	c.holders.mu.Unlock()
	c.tokenStore.mu.Lock()
	c.revoked = h.Revoked
	c.tokenStore.mu.Unlock()
	// The lease outlives ctx: requests at work after it ends are still
	// answered, until Close.
	leaseCtx, stopLease := context.WithCancel(context.WithoutCancel(ctx))
	c.leaseMu.Lock()
	c.stopLease = stopLease
	c.leaseMu.Unlock()
	first := make(chan struct{})
	c.leasing.Go(func() { c.lease.run(leaseCtx, h.Regained, first) })
	<-first
	// Forwards are answered with a context of their own: the end of ctx
	// stops the intake, never a request at work, whose sender waits on
	// another node.
	work := context.WithoutCancel(ctx)
	fwd, err := c.nc.Subscribe(nodeSubject(c.node), func(m *nats.Msg) {
		// One at a time per subscription is NATS's way; requests of
		// different tunnels must not wait for each other.
		c.serving.handling.Go(func() { c.answer(work, h, m) })
	})
	if err != nil {
		return err
	}
	kick, err := c.nc.Subscribe(subjectKick+"*", func(m *nats.Msg) {
		h.Kicked(strings.TrimPrefix(m.Subject, subjectKick))
	})
	if err != nil {
		fwd.Unsubscribe()
		return err
	}
	// The answer goes once the queue is counted: the asking node answers
	// its sender 202 only then (Kick).
	asked, err := c.nc.Subscribe(kickSubject(c.node), func(m *nats.Msg) {
		h.Kicked(m.Header.Get(hdrTunnel))
		m.Respond(nil)
	})
	if err != nil {
		fwd.Unsubscribe()
		kick.Unsubscribe()
		return err
	}
	<-ctx.Done()
	c.drain(fwd)
	c.serving.handling.Wait()
	kick.Unsubscribe()
	asked.Unsubscribe()
	c.holders.mu.Lock()
	c.takenOver, c.kicked = nil, nil
	c.holders.mu.Unlock()
	c.tokenStore.mu.Lock()
	c.revoked = nil
	c.tokenStore.mu.Unlock()
	return nil
}

// drain stops sub's intake and returns once what it had buffered has
// reached its handler. Without NATS, nothing buffered can be answered
// anyway: the other nodes' waits end in progressSilence.
func (c *Cluster) drain(sub *nats.Subscription) {
	closed := sub.StatusChanged(nats.SubscriptionClosed)
	if err := sub.Drain(); err != nil {
		sub.Unsubscribe()
		return
	}
	select {
	case <-closed:
	case <-time.After(drainTimeout):
		c.log.Warn("forwards from other nodes still buffered after the drain's time; dropping them", "waited", drainTimeout)
		sub.Unsubscribe()
	}
}

func (c *Cluster) answer(ctx context.Context, h relay.NodeHandlers, m *nats.Msg) {
	if m.Reply == "" {
		return
	}
	takeBy, ok := c.claim(m)
	if !ok {
		return
	}
	// The forwarding node hears every progressEvery that the request is
	// still at work.
	progress := nats.NewMsg(m.Reply)
	progress.Header.Set(hdrProgress, "1")
	stop := make(chan struct{})
	var ticking sync.WaitGroup
	ticking.Go(func() {
		t := time.NewTicker(progressEvery)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				c.nc.PublishMsg(progress)
			case <-stop:
				return
			}
		}
	})
	a := c.handle(ctx, h, m, takeBy)
	close(stop)
	ticking.Wait()
	reply := nats.NewMsg(m.Reply)
	var offer *bodyOffer
	if len(a.Body) > c.bodies.maxInline {
		var err error
		if offer, err = c.offerBody(reply, a.Body); err != nil {
			c.log.Warn("offer an answer's body", "err", err)
			a = (retryLater("the relay node holding the agent could not pass its answer on; retry"))
		} else {
			defer offer.stop()
			a = &wire.Answer{Status: a.Status, Header: a.Header}
		}
	}
	reply.Data = wire.AppendAnswer(nil, a)
	if err := c.nc.PublishMsg(reply); err != nil {
		// The other node's wait ends in progressSilence and its sender is
		// told to retry: a handler that ran is not reported as stored.
		c.log.Warn("an answer for another node could not be sent", "err", err, "status", a.Status)
		return
	}
	if offer != nil && !offer.await() {
		c.log.Warn("the other node did not fetch an answer's body", "waited", offerSilence)
	}
}

// claim tells the forwarding node that this one has m, and waits for its
// go. It returns by when the request must be delivered or queued, and
// false when the forwarding node gave no go: it had answered its sender
// already, who retries.
func (c *Cluster) claim(m *nats.Msg) (takeBy time.Time, ok bool) {
	claim := nats.NewMsg(m.Reply)
	claim.Header.Set(hdrProgress, "1")
	wait, err := strconv.ParseInt(m.Header.Get(hdrBudget), 10, 64)
	if err != nil {
		// A node of an older calltap gives no go: it hears that the
		// request is here, and this node takes it at once, as it did.
		c.nc.PublishMsg(claim)
		return time.Time{}, true
	}
	goes, err := c.nc.SubscribeSync(c.nc.NewInbox())
	if err != nil {
		c.log.Warn("claim a request from another node", "err", err)
		return time.Time{}, false
	}
	defer goes.Unsubscribe()
	claim.Reply = goes.Subject
	sent := time.Now()
	if err := c.nc.PublishMsg(claim); err != nil {
		c.log.Warn("claim a request from another node", "err", err)
		return time.Time{}, false
	}
	// The go comes within a round trip if the other node still waits; it
	// waits no longer than its budget from before this node had the
	// forward, so after that (counted from now) no go comes.
	g, err := goes.NextMsg(time.Duration(wait) * time.Millisecond)
	if err != nil {
		c.log.Info("a request from another node was answered there before this node could take it; dropped: its sender retries",
			"tunnel", m.Header.Get(hdrTunnel), "waited", time.Since(sent).Round(time.Millisecond))
		return time.Time{}, false
	}
	budget, err := strconv.ParseInt(g.Header.Get(hdrBudget), 10, 64)
	if err != nil {
		c.log.Warn("unreadable go from another node", "budget", g.Header.Get(hdrBudget))
		return time.Time{}, false
	}
	// The budget runs from the go's sending, which came after the claim's:
	// counted from the claim, this node's time is up first.
	return sent.Add(time.Duration(budget)*time.Millisecond - takeMargin), true
}

// takeMargin is kept from a go's budget: the time from the holding node's
// check to the request's delivery, and for its first word after to reach
// the forwarding node.
const takeMargin = progressEvery

// handle runs a forwarded request through the relay and returns its answer.
func (c *Cluster) handle(ctx context.Context, h relay.NodeHandlers, m *nats.Msg, takeBy time.Time) *wire.Answer {
	req, err := wire.DecodeForward(m.Data)
	if err == nil {
		if body, parted, ferr := c.fetchBody(ctx, m.Header); parted {
			req.Body, err = body, ferr
		}
	}
	if err != nil {
		c.log.Warn("unreadable request from another node", "err", err)
		return retryLater("the request could not be handed between relay nodes; retry")
	}
	return h.Forward(ctx, m.Header.Get(hdrTunnel), req, takeBy)
}

// retryLater is a 503 with Retry-After: its sender retries.
func retryLater(msg string) *wire.Answer {
	a := relay.ErrorAnswer(api.Errorf(http.StatusServiceUnavailable, api.CodeUnavailable, "%s", msg))
	a.Header = append(a.Header, wire.HeaderField{Name: "Retry-After", Value: "5"})
	return a
}
