// The node's NATS connection as every part uses it, and the names the
// parts share in NATS: what each part's file builds on.

package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Names in NATS.
const (
	bucketTokens  = "calltap_tokens"
	bucketTunnels = "calltap_tunnels"
	bucketCerts   = "calltap_certs"
	bucketClaims  = "calltap_claims"
	bucketCalls   = "calltap_calls"
	streamQueue   = "CALLTAP_QUEUE"
	subjectQueue  = "calltap.queue." // + tunnel id
	subjectKick   = "calltap.kick."  // + tunnel id
)

func nodeSubject(node string) string { return "calltap.node." + node + ".forward" }

// kickSubject is where a node hears, and answers once it has counted,
// that another node queued a request for a tunnel it holds (Kick).
func kickSubject(node string) string { return "calltap.node." + node + ".kick" }

// Message headers.
const (
	hdrTunnel     = "Calltap-Tunnel"
	hdrBodyChunks = "Calltap-Body-Chunks" // the body is in CALLTAP_BODIES, at these sequences
	hdrArrived    = "Calltap-Arrived"
	hdrMethod     = "Calltap-Method"
	hdrRetracted  = "Calltap-Retracted" // a marker in the queue, no request (queue.go, retract)
	hdrURI        = "Calltap-Uri"
)

// validSeat reports whether seat can be a seat id: a tunnel id, '-' and
// a claim set's key. Anything else (a wildcard, a dot) would name other
// keys and subjects than one seat's.
func validSeat(seat string) bool {
	return seat != "" && strings.Trim(seat, "0123456789abcdefghijklmnopqrstuvwxyz-") == ""
}

// link is the node's NATS connection as every part uses it.
type link struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	log     *slog.Logger
	timeout time.Duration // Options.RequestTimeout
}

// failoverGrace is how long a request waits for the client to reach
// another NATS server when its own is gone: a failover of a few hundred
// milliseconds should cost the sender a little time, not a 503.
const failoverGrace = 2 * time.Second

// connected returns once NATS is reachable, or fails after failoverGrace.
func (l *link) connected(ctx context.Context) error {
	if l.nc.IsConnected() {
		return nil
	}
	// Listen first, then look again: a reconnection between the two
	// would otherwise go unseen.
	changed := l.nc.StatusChanged(nats.CONNECTED, nats.CLOSED)
	defer l.nc.RemoveStatusListener(changed)
	t := time.NewTimer(failoverGrace)
	defer t.Stop()
	for !l.nc.IsConnected() {
		select {
		case <-changed:
		case <-t.C:
			return errUnavailable
		case <-ctx.Done():
			return errUnavailable
		}
		if l.nc.IsClosed() {
			return errUnavailable
		}
	}
	return nil
}

// stalled logs, once, an operation on NATS still waiting after stallAfter,
// with what it waits on; call the returned func when it ends.
func (l *link) stalled(what string, args ...any) (done func()) {
	start := time.Now()
	t := time.AfterFunc(stallAfter, func() {
		l.log.Warn("waiting on NATS", append([]any{"for", what, "server", l.nc.ConnectedUrlRedacted(), "waited", time.Since(start).Round(time.Millisecond)}, args...)...)
	})
	return func() { t.Stop() }
}

// lastEntry reads the newest value of key in bucket from the leader of
// the bucket's stream: a KeyValue Get is a direct get, which any replica
// answers, and a replica may not have heard of a write another node made
// a moment ago. The jetstream package reads direct whenever the stream
// allows it, which a bucket does; nats.go's older JetStream context reads
// the leader unless told otherwise. A key deleted or purged (an empty
// value) is jetstream.ErrKeyNotFound.
func (l *link) lastEntry(ctx context.Context, bucket, key string) (value []byte, rev uint64, err error) {
	js, err := l.nc.JetStream()
	if err != nil {
		return nil, 0, err
	}
	m, err := js.GetLastMsg("KV_"+bucket, "$KV."+bucket+"."+key, nats.Context(ctx))
	if errors.Is(err, nats.ErrMsgNotFound) || err == nil && len(m.Data) == 0 {
		return nil, 0, jetstream.ErrKeyNotFound
	} else if err != nil {
		return nil, 0, err
	}
	return m.Data, m.Sequence, nil
}

// lastRecord reads the newest value of key in bucket from the leader
// (lastEntry) into rec, a JSON record, and returns its revision.
func (l *link) lastRecord(ctx context.Context, bucket, key string, rec any) (uint64, error) {
	v, rev, err := l.lastEntry(ctx, bucket, key)
	if err != nil {
		return 0, err
	}
	if err := json.Unmarshal(v, rec); err != nil {
		return 0, fmt.Errorf("the record of %s in %s: %w", key, bucket, err)
	}
	return rev, nil
}

// stallAfter is how long an operation on NATS waits before it is logged.
const stallAfter = 2 * time.Second

var errUnavailable = errors.New("cluster: no NATS server is reachable")
