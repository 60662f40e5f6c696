// The offline queue in stream CALLTAP_QUEUE: one subject per tunnel, the
// stream sequence as the queue's seq. A message's headers carry the
// request line; its data is the request's headers (uvarint length, then
// the wire encoding) and its body, unless the body is in chunks (bodies.go).

package cluster

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/calltap/calltap/relay"
	"github.com/calltap/calltap/storage/relaystate"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// queue is the offline queue in CALLTAP_QUEUE.
type queue struct {
	*link
	stream jetstream.Stream
	bodies *bodyStore

	mu       sync.Mutex
	bodyKeys map[int64]string // guarded by mu; queue seq → its body's chunks, for Dequeue

	retractCtx  context.Context // ends with Close: retractions under way give up
	stopRetract context.CancelFunc
	retracting  sync.WaitGroup // retract's goroutines
}

func newQueue(l *link, stream jetstream.Stream, bodies *bodyStore) *queue {
	ctx, cancel := context.WithCancel(context.Background())
	return &queue{link: l, stream: stream, bodies: bodies, bodyKeys: map[int64]string{}, retractCtx: ctx, stopRetract: cancel}
}

// close lets the retractions under way finish, for retractAtStop at most,
// then stops them. A stop often follows the fault that made them (a node
// restarted after its NATS server stalled): cut at once, a retraction
// left the request it was to keep out stored, and delivered later to the
// agent (TestFrozenNATSServerQueuesNoLateCopy, on a busy machine).
func (c *queue) close() {
	done := make(chan struct{})
	go func() { c.retracting.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(retractAtStop):
		c.log.Warn("retractions still under way are given up at the stop; a request whose sender was told to retry may reach the agent as well as the retry")
	}
	c.stopRetract()
	<-done
}

// Enqueue stores r in the stream and returns once JetStream has it on the
// replicas it was asked for.
func (c *queue) Enqueue(ctx context.Context, r *relaystate.QueuedRequest) error {
	if err := c.connected(ctx); err != nil {
		return err
	}
	m := nats.NewMsg(subjectQueue + r.TunnelID)
	m.Header.Set(jetstream.MsgIDHeader, r.ID)
	m.Header.Set(hdrArrived, strconv.FormatInt(r.ArrivedAt, 10))
	m.Header.Set(hdrMethod, r.Method)
	m.Header.Set(hdrURI, r.URI)
	data := binary.AppendUvarint(nil, uint64(len(r.Headers)))
	data = append(data, r.Headers...)
	var chunks string
	if len(r.Body) > c.bodies.maxInline {
		bctx, cancel := context.WithTimeout(ctx, c.timeout)
		defer cancel()
		var err error
		if chunks, err = c.bodies.put(bctx, r.ID, r.Body); err != nil {
			return fmt.Errorf("store the body: %w", err)
		}
		m.Header.Set(hdrBodyChunks, chunks)
	} else {
		data = append(data, r.Body...)
	}
	m.Data = data
	// The sender waits for all that follows: two operations' worth at most.
	ctx, cancel := context.WithTimeout(ctx, 2*c.timeout)
	defer cancel()
	// A stream whose leader was on a NATS server just gone has none for a
	// moment: publishing again rides out the election. So does publishing
	// again once the client has reached another server, when its own died
	// under the publish. The message id keeps a publish whose ack was lost
	// from being stored twice.
	ack, unsure, err := c.publish(ctx, m, r)
	if err != nil {
		var apiErr *jetstream.APIError
		if unsure || !errors.As(err, &apiErr) {
			// The message may be stored, its ack lost, or be stored later
			// still: a NATS server that froze holding the publish stores
			// it when it wakes. It is retracted, so that it is not
			// delivered besides its sender's retry; but a drain may read
			// it first, so the sender is told the outcome is unknown.
			c.retract(subjectQueue+r.TunnelID, r.ID, chunks)
			return fmt.Errorf("%w: %w", relay.ErrMaybeStored, err)
		}
		c.bodies.delete(context.WithoutCancel(ctx), chunks)
		if strings.Contains(apiErr.Description, "maximum messages per subject") {
			return relay.ErrQueueFull
		}
		return err
	}
	r.Seq = int64(ack.Sequence)
	return nil
}

// publish stores m, publishing again while the connection fails under it
// (publishTries at most). unsure is set when a try ended with no word on
// whether JetStream stored it, or when JetStream said a message of that id
// was still in process: then an API error on a later try does not mean the
// request was not stored (chaos run, team seed 3301: a publish timed out
// as NATS lost its quorum, the next was refused "duplicate message id is
// in process", its sender was told "not stored", and the first was stored
// and delivered when the quorum came back).
func (c *queue) publish(ctx context.Context, m *nats.Msg, r *relaystate.QueuedRequest) (ack *jetstream.PubAck, unsure bool, err error) {
	for try := 1; ; try++ {
		pctx, cancel := context.WithTimeout(ctx, c.timeout)
		ack, err = c.js.PublishMsg(pctx, m, jetstream.WithRetryAttempts(10), jetstream.WithRetryWait(200*time.Millisecond))
		cancel()
		var apiErr *jetstream.APIError
		isAPI := errors.As(err, &apiErr)
		unsure = unsure || (err != nil && !isAPI) || (isAPI && apiErr.ErrorCode == errCodeInProcess)
		if err == nil || isAPI || try == publishTries || ctx.Err() != nil {
			return ack, unsure, err
		}
		c.log.Debug("publish again", "tunnel", r.TunnelID, "id", r.ID, "err", err)
		if c.connected(ctx) != nil {
			return ack, unsure, err
		}
	}
}

// errCodeInProcess is JetStream's answer to a publish whose message id is
// that of one it is still storing.
const errCodeInProcess jetstream.ErrorCode = 10158

// retract makes sure the request id, which Enqueue failed to store, is
// never delivered: in the background, as soon as NATS answers, it stores a
// marker under the same message id. If the request was stored meanwhile,
// JetStream names it a duplicate and gives the request's sequence, which
// is deleted; if not, the marker holds the id, so that the request, should
// it arrive later, is refused as a duplicate for the stream's duplicate
// window (2 min); the marker itself is skipped by QueuedAfter and deleted.
// A request stored and read by a drain before NATS answered this node
// still reaches the agent, which marks its sender's retry duplicate_of it.
func (c *queue) retract(subject, id, chunks string) {
	c.retracting.Go(func() {
		ctx, cancel := context.WithTimeout(c.retractCtx, retractFor)
		defer cancel()
		m := nats.NewMsg(subject)
		m.Header.Set(jetstream.MsgIDHeader, id)
		m.Header.Set(hdrRetracted, "1")
		wait := readRetry
		for {
			ack, err := c.publishOnce(ctx, m)
			if err == nil {
				c.dropRetracted(ctx, id, ack, chunks)
				return
			}
			if ctx.Err() != nil {
				c.log.Warn("a request whose sender was told to retry could not be retracted; it may reach the agent as well as the retry", "id", id, "err", err)
				return
			}
			select {
			case <-time.After(wait):
			case <-ctx.Done():
			}
			wait = min(2*wait, time.Second)
		}
	})
}

// How retract tries: for as long as the stream remembers message ids, a
// moment apart at first.
const (
	retractFor    = 2 * time.Minute
	readRetry     = 100 * time.Millisecond
	retractAtStop = 10 * time.Second // what a node's stop gives them
)

func (c *queue) publishOnce(ctx context.Context, m *nats.Msg) (*jetstream.PubAck, error) {
	if err := c.connected(ctx); err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	return c.js.PublishMsg(pctx, m)
}

// dropRetracted deletes what ack names: the request itself, stored after
// all, or the marker that now keeps it out.
func (c *queue) dropRetracted(ctx context.Context, id string, ack *jetstream.PubAck, chunks string) {
	if ack.Duplicate {
		c.log.Warn("a request whose sender was told to retry had been queued after all; deleted", "id", id, "seq", ack.Sequence)
	}
	for {
		dctx, cancel := context.WithTimeout(ctx, c.timeout)
		err := c.stream.DeleteMsg(dctx, ack.Sequence)
		cancel()
		if err == nil || errors.Is(err, jetstream.ErrMsgNotFound) || ctx.Err() != nil {
			break
		}
		select {
		case <-time.After(readRetry):
		case <-ctx.Done():
		}
	}
	c.bodies.delete(ctx, chunks)
}

// publishTries bounds how often Enqueue publishes one request when the
// connection fails under it.
const publishTries = 3

// QueuedAfter returns up to limit requests of tunnelID after seq after, in
// stream order. Each is one read from the stream's leader, so that a
// request deleted once delivered is never read again from a replica that
// has not heard yet.
func (c *queue) QueuedAfter(ctx context.Context, tunnelID string, after int64, limit int) ([]*relaystate.QueuedRequest, error) {
	if err := c.connected(ctx); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	subject := subjectQueue + tunnelID
	var out []*relaystate.QueuedRequest
	seq := uint64(after) + 1
	for len(out) < limit {
		m, err := c.stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		} else if err != nil {
			return nil, err
		}
		if m.Header.Get(hdrRetracted) != "" {
			seq = m.Sequence + 1 // a marker of retract's, about to go
			continue
		}
		q, err := c.decodeQueued(ctx, m)
		if err != nil {
			return nil, fmt.Errorf("queued message %d: %w", m.Sequence, err)
		}
		q.TunnelID = tunnelID
		out = append(out, q)
		seq = m.Sequence + 1
	}
	return out, nil
}

func (c *queue) decodeQueued(ctx context.Context, m *jetstream.RawStreamMsg) (*relaystate.QueuedRequest, error) {
	arrived, _ := strconv.ParseInt(m.Header.Get(hdrArrived), 10, 64)
	q := &relaystate.QueuedRequest{
		Seq: int64(m.Sequence), ID: m.Header.Get(jetstream.MsgIDHeader), ArrivedAt: arrived,
		Method: m.Header.Get(hdrMethod), URI: m.Header.Get(hdrURI),
	}
	n, k := binary.Uvarint(m.Data)
	if k <= 0 || uint64(len(m.Data)-k) < n {
		return nil, errors.New("malformed")
	}
	q.Headers = m.Data[k : k+int(n)]
	q.Body = m.Data[k+int(n):]
	if chunks := m.Header.Get(hdrBodyChunks); chunks != "" {
		b, err := c.bodies.get(ctx, chunks)
		if err != nil {
			return nil, fmt.Errorf("body: %w", err)
		}
		q.Body = b
		c.mu.Lock()
		c.bodyKeys[q.Seq] = chunks
		c.mu.Unlock()
	}
	return q, nil
}

// Dequeue removes delivered requests. The deletes go out together: each
// is a round of the stream's replication, and one after another they would
// bound the drain (the relay opens its window only once they are done).
func (c *queue) Dequeue(ctx context.Context, seqs ...int64) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	for _, seq := range seqs {
		c.mu.Lock()
		chunks := c.bodyKeys[seq]
		delete(c.bodyKeys, seq)
		c.mu.Unlock()
		wg.Go(func() {
			err := c.stream.DeleteMsg(ctx, uint64(seq))
			if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
				mu.Lock()
				first = cmp.Or(first, err)
				mu.Unlock()
			}
			c.bodies.delete(ctx, chunks)
		})
	}
	wg.Wait()
	return first
}

// purgeSeat removes a released seat's queue, with the chunks of the
// bodies its requests kept in CALLTAP_BODIES, and returns how many
// requests it held. The requests' heads are read first (headers only: a
// queue of inline bodies could be gigabytes), for their chunks; a request
// queued for the seat between that read and the purge goes uncounted,
// and its chunks with the bodies stream's max age.
func (c *queue) purgeSeat(ctx context.Context, seat string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	subject := subjectQueue + seat
	held, chunks, err := c.heads(ctx, subject)
	if err != nil {
		return 0, err
	}
	if err := c.stream.Purge(ctx, jetstream.WithPurgeSubject(subject)); err != nil {
		return 0, err
	}
	for _, ch := range chunks {
		c.bodies.delete(ctx, ch)
	}
	return held, nil
}

// heads counts the requests queued on subject, and returns their body
// chunks (Calltap-Body-Chunks) for those kept in CALLTAP_BODIES.
func (c *queue) heads(ctx context.Context, subject string) (held int, chunks []string, err error) {
	info, err := c.stream.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil || info.State.Subjects[subject] == 0 {
		return 0, nil, err
	}
	// The read is a fetch or a few, back to back: a consumer left by a
	// node stopped in the middle goes soon after.
	cons, err := c.stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}, HeadersOnly: true, InactiveThreshold: 30 * time.Second})
	if err != nil {
		return 0, nil, err
	}
	var h queuedHeads
	for {
		// One fetch takes the whole queue but for requests queued
		// meanwhile; a fetch without wait ends with what there is.
		batch, err := cons.FetchNoWait(int(info.State.Subjects[subject]))
		if err != nil {
			return 0, nil, err
		}
		more, err := h.read(batch)
		if err != nil || !more {
			return h.held, h.chunks, err
		}
	}
}

// queuedHeads tallies the heads of a queue's messages.
type queuedHeads struct {
	held   int      // requests, not counting retract's markers
	chunks []string // their Calltap-Body-Chunks, where they have one
}

// read tallies a batch, and reports whether the consumer has more.
func (h *queuedHeads) read(batch jetstream.MessageBatch) (more bool, err error) {
	n := 0
	for m := range batch.Messages() {
		n++
		if meta, err := m.Metadata(); err == nil {
			more = meta.NumPending > 0
		}
		if m.Headers().Get(hdrRetracted) != "" {
			continue // a marker of retract's, no request
		}
		h.held++
		if ch := m.Headers().Get(hdrBodyChunks); ch != "" {
			h.chunks = append(h.chunks, ch)
		}
	}
	if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
		return false, err
	}
	return more && n > 0, nil
}

// QueueStatsByTunnel counts every tunnel's queue. Bytes are not counted:
// the stream keeps counts per subject, not sizes.
func (c *queue) QueueStatsByTunnel(ctx context.Context) (map[string]relaystate.QueueStats, error) {
	return c.queueStats(ctx, subjectQueue+"*")
}

// TunnelQueueStats counts one tunnel's queue.
func (c *queue) TunnelQueueStats(ctx context.Context, tunnelID string) (relaystate.QueueStats, error) {
	m, err := c.queueStats(ctx, subjectQueue+tunnelID)
	return m[tunnelID], err
}

func (c *queue) queueStats(ctx context.Context, filter string) (map[string]relaystate.QueueStats, error) {
	if err := c.connected(ctx); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	info, err := c.stream.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return nil, err
	}
	out := map[string]relaystate.QueueStats{}
	for subject, n := range info.State.Subjects {
		out[strings.TrimPrefix(subject, subjectQueue)] = relaystate.QueueStats{Count: int(n)}
	}
	return out, nil
}

// ExpireQueued does nothing: the stream drops what is older than its max
// age by itself.
func (c *queue) ExpireQueued(context.Context, time.Time) (int64, error) { return 0, nil }
