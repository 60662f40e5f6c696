// Queued bodies too large for one NATS message (the servers' max_payload,
// 1 MiB unless raised; the relay takes up to --max-body, 10 MiB) are cut
// into chunks in stream CALLTAP_BODIES and named by the chunks' sequences
// in the queued message: they must outlive the node that queued them. (A
// live forward's body goes straight between two nodes: parts.go.) Chunks are read back from the
// stream's leader, by sequence: a JetStream object store reads through
// replicas (direct get), and a replica may not have a chunk the moment
// another node asks for it.

package cluster

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

const (
	streamBodies = "CALLTAP_BODIES"
	subjectBody  = "calltap.body." // + request id
)

// bodyStore keeps the chunks in CALLTAP_BODIES.
type bodyStore struct {
	*link
	stream jetstream.Stream

	// maxInline is the largest body sent inside a message; larger ones go
	// in chunks of this size. NATS refuses a message over the servers'
	// max_payload (1 MiB unless raised), and the relay takes bodies of up
	// to --max-body (10 MiB).
	maxInline int
}

// put stores body in chunks and returns their sequences, for the
// Calltap-Body-Chunks header.
func (c *bodyStore) put(ctx context.Context, id string, body []byte) (string, error) {
	var acks []jetstream.PubAckFuture
	for off := 0; off < len(body); off += c.maxInline {
		m := nats.NewMsg(subjectBody + id)
		m.Data = body[off:min(off+c.maxInline, len(body))]
		f, err := c.js.PublishMsgAsync(m)
		if err != nil {
			return "", err
		}
		acks = append(acks, f)
	}
	seqs := make([]string, 0, len(acks))
	for _, f := range acks {
		select {
		case ack := <-f.Ok():
			seqs = append(seqs, strconv.FormatUint(ack.Sequence, 10))
		case err := <-f.Err():
			c.delete(context.WithoutCancel(ctx), strings.Join(seqs, ","))
			return "", err
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	return strings.Join(seqs, ","), nil
}

// get reads back what put stored.
func (c *bodyStore) get(ctx context.Context, chunks string) ([]byte, error) {
	var body []byte
	for s := range strings.SplitSeq(chunks, ",") {
		seq, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("chunk %q: %w", s, err)
		}
		m, err := c.stream.GetMsg(ctx, seq)
		if err != nil {
			return nil, fmt.Errorf("chunk %d: %w", seq, err)
		}
		body = append(body, m.Data...)
	}
	return body, nil
}

// delete removes the chunks; the stream's max age removes what a dead
// node left behind.
func (c *bodyStore) delete(ctx context.Context, chunks string) {
	if chunks == "" {
		return
	}
	for s := range strings.SplitSeq(chunks, ",") {
		seq, _ := strconv.ParseUint(s, 10, 64)
		if err := c.stream.DeleteMsg(ctx, seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			c.log.Debug("delete body chunk", "seq", seq, "err", err)
		}
	}
}
