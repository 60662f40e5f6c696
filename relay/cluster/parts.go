// Bodies of live forwards too large for one NATS message go straight
// between the two nodes, in parts, over core NATS: the node that has the
// body serves it on an inbox of its own, named in the message that would
// have carried it (hdrBodyAt, hdrBodySize, hdrBodyPart), and the other
// node asks for each part by its index:
//
//	request  <inbox>  data: the part's index, decimal
//	reply             data: the body's bytes [index*part, min((index+1)*part, size))
//
// Nothing is stored: a live body lives as long as its exchange, and its
// sender retries if a node dies. (A queued body must outlive its node: it
// goes in CALLTAP_BODIES, bodies.go.) Going through JetStream instead cost
// a replicated write and a JSON-wrapped read per part, seconds per large
// body on a loaded machine.

package cluster

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

const (
	hdrBodyAt   = "Calltap-Body-At"   // the inbox serving the body's parts
	hdrBodySize = "Calltap-Body-Size" // the body's length
	hdrBodyPart = "Calltap-Body-Part" // the length of each part but the last
)

const (
	// partTimeout bounds the wait for one part: a node that holds a body
	// answers at once unless it is frozen; a dead one is known at once
	// (no responders).
	partTimeout = 15 * time.Second
	// partsInFlight is how many parts a node asks for at a time.
	partsInFlight = 4
	// maxPartedBody bounds what a node accepts to fetch, well above any
	// relay's --max-body.
	maxPartedBody = 1 << 30
	// offerSilence is how long a node serving an answer's body waits for
	// the next part to be asked for before it gives up on the other node.
	offerSilence = 10 * time.Second
)

// bodyOffer serves one body's parts until stopped.
type bodyOffer struct {
	sub    *nats.Subscription
	asked  chan struct{} // a part was asked for; cap 1
	served chan struct{} // closed once every part was served
}

// offerBody serves body in parts of c.bodies.maxInline on a new inbox and
// names it in m's header.
func (c *Cluster) offerBody(m *nats.Msg, body []byte) (*bodyOffer, error) {
	part := max(c.bodies.maxInline, 1)
	parts := (len(body) + part - 1) / part
	o := &bodyOffer{asked: make(chan struct{}, 1), served: make(chan struct{})}
	var (
		seen   = make([]bool, parts) // owned by the subscription's handler: NATS calls it one message at a time
		unseen = parts
	)
	inbox := c.nc.NewInbox()
	sub, err := c.nc.Subscribe(inbox, func(r *nats.Msg) {
		i, err := strconv.Atoi(string(r.Data))
		if err != nil || i < 0 || i >= parts {
			r.Respond(nil) // an empty part: the asking node's length check fails
			return
		}
		r.Respond(body[i*part : min((i+1)*part, len(body))])
		select {
		case o.asked <- struct{}{}:
		default:
		}
		if !seen[i] {
			seen[i] = true
			if unseen--; unseen == 0 {
				close(o.served)
			}
		}
	})
	if err != nil {
		return nil, err
	}
	o.sub = sub
	m.Header.Set(hdrBodyAt, inbox)
	m.Header.Set(hdrBodySize, strconv.Itoa(len(body)))
	m.Header.Set(hdrBodyPart, strconv.Itoa(part))
	return o, nil
}

// stop ends the offer.
func (o *bodyOffer) stop() { o.sub.Unsubscribe() }

// await returns once every part was served, or once no part was asked
// for during offerSilence: the node that was to fetch them is gone.
func (o *bodyOffer) await() bool {
	t := time.NewTimer(offerSilence)
	defer t.Stop()
	for {
		select {
		case <-o.served:
			return true
		case <-o.asked:
			t.Reset(offerSilence)
		case <-t.C:
			return false
		}
	}
}

// errPartedBody is fetchBody's error for a header that names no valid body.
var errPartedBody = errors.New("cluster: a body in parts with an invalid size")

// fetchBody reads the body h names, if any: ok is false when h names none.
func (c *Cluster) fetchBody(ctx context.Context, h nats.Header) (body []byte, ok bool, err error) {
	at := h.Get(hdrBodyAt)
	if at == "" {
		return nil, false, nil
	}
	size, err1 := strconv.Atoi(h.Get(hdrBodySize))
	part, err2 := strconv.Atoi(h.Get(hdrBodyPart))
	if err1 != nil || err2 != nil || size < 0 || size > maxPartedBody || part <= 0 {
		return nil, true, errPartedBody
	}
	body, err = c.fetchParts(ctx, at, size, part)
	return body, true, err
}

// fetchParts reads a body of size bytes from the node answering at, in
// parts of part bytes, partsInFlight at a time; the first part that fails
// stops the rest.
func (c *Cluster) fetchParts(ctx context.Context, at string, size, part int) ([]byte, error) {
	parts := (size + part - 1) / part
	body := make([]byte, size)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		slots = make(chan struct{}, partsInFlight)
		mu    sync.Mutex
		first error // guarded by mu
	)
	fail := func(err error) {
		mu.Lock()
		if first == nil {
			first = err
		}
		mu.Unlock()
		cancel()
	}
	for i := range parts {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			defer func() { <-slots }()
			if err := c.fetchPart(ctx, at, i, body[i*part:min((i+1)*part, size)]); err != nil {
				fail(err)
			}
		})
	}
	wg.Wait()
	if first == nil && ctx.Err() != nil {
		first = ctx.Err()
	}
	if first != nil {
		return nil, first
	}
	return body, nil
}

// fetchPart reads part i of a body from the node answering at into want,
// which it must fill exactly.
func (c *Cluster) fetchPart(ctx context.Context, at string, i int, want []byte) error {
	ctx, cancel := context.WithTimeout(ctx, partTimeout)
	defer cancel()
	r, err := c.nc.RequestWithContext(ctx, at, strconv.AppendInt(nil, int64(i), 10))
	if err != nil {
		return err
	}
	if len(r.Data) != len(want) {
		return fmt.Errorf("part %d: %d bytes, want %d", i, len(r.Data), len(want))
	}
	copy(want, r.Data)
	return nil
}
