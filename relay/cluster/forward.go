// Requests between nodes: Forward on the node a sender reached, Serve on
// the node holding the agent.
//
// The exchange is a message to calltap.node.<node>.forward with a reply
// inbox. The holding node answers on that inbox at once with an empty
// progress message (hdrProgress), again every progressEvery while the
// request is at work, and last with the answer. The forwarding node so
// tells a node that is frozen, or whose NATS server is, from a handler
// that takes its time: silence for progressSilence ends the wait with an
// error its sender is told to retry, instead of the whole forward timeout.

package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/calltap/calltap/relay"
	"github.com/calltap/calltap/relay/api"
	"github.com/nats-io/nats.go"
)

const (
	hdrProgress = "Calltap-Progress" // a reply that only says the request is at work
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
func (c *Cluster) Forward(ctx context.Context, node, tunnelID string, req *relay.Request) (*relay.Answer, error) {
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
	m.Data = relay.AppendForward(nil, &out)
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
	if err != nil {
		return nil, err
	}
	a, err := relay.DecodeAnswer(reply.Data)
	if err != nil {
		return nil, fmt.Errorf("answer of node %s: %w", node, err)
	}
	if body, ok, err := c.fetchBody(ctx, reply.Header); err != nil {
		return nil, fmt.Errorf("answer body of node %s: %w", node, err)
	} else if ok {
		a.Body = body
	}
	return a, nil
}

// awaitAnswer reads replies until the answer, skipping progress, and fails
// after progressSilence without a word.
func (c *Cluster) awaitAnswer(ctx context.Context, replies *nats.Subscription) (*nats.Msg, error) {
	for {
		wctx, cancel := context.WithTimeout(ctx, progressSilence)
		reply, err := replies.NextMsgWithContext(wctx)
		cancel()
		switch {
		case err != nil && ctx.Err() != nil:
			return nil, ctx.Err()
		case err != nil && errors.Is(err, context.DeadlineExceeded):
			return nil, errHolderSilent
		case errors.Is(err, nats.ErrNoResponders):
			// nats.go reads the server's 503 status into this error.
			return nil, relay.ErrNodeGone
		case err != nil:
			return nil, err
		case reply.Header.Get(hdrStatus) == "503" && len(reply.Data) == 0:
			// Nobody subscribes to that node's subject: it stopped or
			// died. The holder entry stays as it is: only the holder or
			// a node taking over changes it.
			return nil, relay.ErrNodeGone
		case reply.Header.Get(hdrProgress) != "":
			continue
		}
		return reply, nil
	}
}

// Kick tells every node that tunnelID's queue grew; the one holding its
// agent drains it.
func (c *Cluster) Kick(tunnelID string) {
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
	<-ctx.Done()
	c.drain(fwd)
	c.serving.handling.Wait()
	kick.Unsubscribe()
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
	// The forwarding node learns at once that the request is here, then
	// every progressEvery that it is still at work.
	progress := nats.NewMsg(m.Reply)
	progress.Header.Set(hdrProgress, "1")
	c.nc.PublishMsg(progress)
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
	a := c.handle(ctx, h, m)
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
			a = &relay.Answer{Status: a.Status, Header: a.Header}
		}
	}
	reply.Data = relay.AppendAnswer(nil, a)
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

// handle runs a forwarded request through the relay and returns its answer.
func (c *Cluster) handle(ctx context.Context, h relay.NodeHandlers, m *nats.Msg) *relay.Answer {
	req, err := relay.DecodeForward(m.Data)
	if err == nil {
		if body, parted, ferr := c.fetchBody(ctx, m.Header); parted {
			req.Body, err = body, ferr
		}
	}
	if err != nil {
		c.log.Warn("unreadable request from another node", "err", err)
		return retryLater("the request could not be handed between relay nodes; retry")
	}
	return h.Forward(ctx, m.Header.Get(hdrTunnel), req)
}

// retryLater is a 503 with Retry-After: its sender retries.
func retryLater(msg string) *relay.Answer {
	a := relay.ErrorAnswer(api.Errorf(http.StatusServiceUnavailable, api.CodeUnavailable, "%s", msg))
	a.Header = append(a.Header, relay.HeaderField{Name: "Retry-After", Value: "5"})
	return a
}
