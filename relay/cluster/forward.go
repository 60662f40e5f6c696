// Requests between nodes: Forward on the node a sender reached, Serve on
// the node holding the agent.

package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"

	"github.com/calltap/calltap/relay"
	"github.com/calltap/calltap/relay/api"
	"github.com/nats-io/nats.go"
)

// Forward hands req to node and waits for its answer.
func (c *Cluster) Forward(ctx context.Context, node, tunnelID string, req *relay.Request) (*relay.Answer, error) {
	if err := c.connected(ctx); err != nil {
		return nil, err
	}
	m := nats.NewMsg(nodeSubject(node))
	m.Header.Set(hdrTunnel, tunnelID)
	out := *req
	if len(req.Body) > c.maxInline {
		chunks, err := c.putBody(ctx, req.ID, req.Body)
		if err != nil {
			return nil, fmt.Errorf("store the body: %w", err)
		}
		defer c.deleteBody(context.WithoutCancel(ctx), chunks)
		m.Header.Set(hdrBodyChunks, chunks)
		out.Body = nil
	}
	m.Data = relay.AppendForward(nil, &out)
	reply, err := c.nc.RequestMsgWithContext(ctx, m)
	if errors.Is(err, nats.ErrNoResponders) {
		c.forgetHolder(tunnelID, node)
		return nil, relay.ErrNodeGone
	} else if err != nil {
		return nil, err
	}
	a, err := relay.DecodeAnswer(reply.Data)
	if err != nil {
		return nil, fmt.Errorf("answer of node %s: %w", node, err)
	}
	if chunks := reply.Header.Get(hdrBodyChunks); chunks != "" {
		defer c.deleteBody(context.WithoutCancel(ctx), chunks)
		if a.Body, err = c.getBody(ctx, chunks); err != nil {
			return nil, fmt.Errorf("answer body of node %s: %w", node, err)
		}
	}
	return a, nil
}

// Kick tells every node that tunnelID's queue grew; the one holding its
// agent drains it.
func (c *Cluster) Kick(tunnelID string) {
	c.nc.Publish(subjectKick+tunnelID, nil)
}

// Serve answers forwards and kicks for this node until ctx ends.
func (c *Cluster) Serve(ctx context.Context, h relay.NodeHandlers) error {
	c.mu.Lock()
	c.takenOver, c.revoked = h.TakenOver, h.Revoked
	c.mu.Unlock()
	var handling sync.WaitGroup
	fwd, err := c.nc.Subscribe(nodeSubject(c.node), func(m *nats.Msg) {
		// One at a time per subscription is NATS's way; requests of
		// different tunnels must not wait for each other.
		handling.Go(func() { c.answer(ctx, h, m) })
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
	fwd.Unsubscribe()
	kick.Unsubscribe()
	handling.Wait()
	c.mu.Lock()
	c.takenOver, c.revoked = nil, nil
	c.mu.Unlock()
	return nil
}

func (c *Cluster) answer(ctx context.Context, h relay.NodeHandlers, m *nats.Msg) {
	var a *relay.Answer
	req, err := relay.DecodeForward(m.Data)
	if err == nil {
		if chunks := m.Header.Get(hdrBodyChunks); chunks != "" {
			req.Body, err = c.getBody(ctx, chunks)
		}
	}
	if err != nil {
		c.log.Warn("unreadable request from another node", "err", err)
		a = relay.ErrorAnswer(api.Errorf(http.StatusBadGateway, api.CodeBadGateway, "the request could not be handed between relay nodes"))
	} else {
		a = h.Forward(ctx, m.Header.Get(hdrTunnel), req)
	}
	reply := nats.NewMsg(m.Reply)
	if len(a.Body) > c.maxInline {
		chunks, err := c.putBody(ctx, req.ID, a.Body)
		if err != nil {
			c.log.Warn("store an answer's body", "err", err)
			return // the other node times out: 504
		}
		reply.Header.Set(hdrBodyChunks, chunks)
		a = &relay.Answer{Status: a.Status, Header: a.Header}
	}
	reply.Data = relay.AppendAnswer(nil, a)
	if err := m.RespondMsg(reply); err != nil {
		c.log.Warn("answer another node", "err", err)
	}
}
