// Package frameconn carries the frames of relay/wire over a websocket: one
// connection with one reader and one writer at a time, a bounded send queue,
// a write deadline per frame, keepalive pings, and writes batched into one
// system call. The relay's end of a tunnel and the agent's both use it.
//
// It is a package of its own, beside wire rather than in it, so that what
// only needs the messages (the inspector's headers, the cluster's node to
// node forwarding) does not link a websocket in.
package frameconn

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/calltap/calltap/relay/wire"
	"github.com/gorilla/websocket"
)

// Keepalive defaults. The relay must notice a dead agent (laptop asleep,
// cable pulled) within 45 s: a pong must arrive within PongWait of the last
// message, and pings go out at 9/10 of that.
//
// An agent is stricter with its relay (DefaultAgentPongWait): a relay node
// that froze is left for another within seconds, while a relay still gives
// a laptop on a poor network the longer wait.
const (
	DefaultPongWait      = 30 * time.Second
	DefaultAgentPongWait = 6 * time.Second
	DefaultWriteWait     = 10 * time.Second
	sendQueueLen         = 256
)

// DefaultProbeEvery is how often the relay's end pings an agent (Accept
// takes it when Keepalive.ProbeEvery is zero). The pong wait catches a dead
// agent; a frozen one (a laptop whose lid closed, a process stopped) keeps
// its connection open and answers nothing, and the relay must learn that
// within seconds to queue its requests rather than keep their senders
// waiting: Conn.Silence tells it.
const DefaultProbeEvery = time.Second

// Keepalive holds the timing of one connection.
type Keepalive struct {
	PongWait  time.Duration // read deadline after each message or pong
	WriteWait time.Duration // deadline for writing one frame
	// ProbeEvery, when positive, pings at this interval rather than at
	// 9/10 of PongWait (if that is shorter), so that Silence is known to
	// within it. Only the relay's end probes: Accept makes a zero one
	// DefaultProbeEvery; a negative one probes not.
	ProbeEvery time.Duration
}

// WithDefaults fills the zero fields with the relay's defaults.
func (k Keepalive) WithDefaults() Keepalive {
	if k.PongWait <= 0 {
		k.PongWait = DefaultPongWait
	}
	if k.WriteWait <= 0 {
		k.WriteWait = DefaultWriteWait
	}
	return k
}

// pingEvery is the interval of the connection's pings: the probe's, or
// 9/10 of the pong wait, whichever is shorter, so that a pong extends
// the read deadline before it runs out.
func (k Keepalive) pingEvery() time.Duration {
	every := k.PongWait * 9 / 10
	if k.ProbeEvery > 0 && k.ProbeEvery < every {
		every = k.ProbeEvery
	}
	return every
}

// Frame is one message to send: a head encoded by wire's Append
// functions, and the body written after it in the same message.
type Frame struct {
	Head []byte
	Body []byte // written after Head in the same message; may be nil
	// Written is called once the frame is out or dropped; may be nil. It
	// runs on the goroutine that wrote or dropped it, under writeMu when
	// written: it must not send on this Conn.
	Written func()
}

// Conn is one websocket with exactly one reader (the owner's read loop,
// calling ReadFrame) and one writer at a time, like the readPump/writePump
// pair of gorilla's chat example.
//
// The writer is whoever holds writeMu. Usually that is sendLoop, draining
// sendq; but a sender that finds the queue empty and nobody writing writes
// its frame itself, sparing a request the hand-off to sendLoop and back —
// at one request in flight those wake-ups are most of a tunnel's latency.
// Frames leave in the order they were queued: every dequeue happens under
// writeMu, and a sender writes directly only when nothing is queued.
type Conn struct {
	ws       *websocket.Conn
	bc       *batchConn   // the socket under ws; batches the writer's frames
	maxFrame int64        // the largest frame this end reads
	peerMax  atomic.Int64 // the largest frame the peer reads; larger sends are refused
	keep     Keepalive

	// writeMu is held by the writer while frames are written (see above):
	// it guards the websocket's writer side and every dequeue of sendq.
	// Frame.Written callbacks run under it.
	writeMu sync.Mutex
	sendq   chan Frame    // bounded; dequeued only under writeMu
	wake    chan struct{} // cap 1: tells sendLoop that sendq has frames

	closeOnce sync.Once
	done      chan struct{} // closed by close
	mu        sync.Mutex    // guards closeErr
	closeErr  error         // guarded by mu: why the connection ended

	// Every ping carries the time it was sent, on the connection's clock
	// (clock), and the peer's pong gives it back: how long the peer has
	// owed a pong is then two atomic loads away (Silence), without a
	// timer or a goroutine per connection.
	start    time.Time    // the clock's zero; its monotonic reading is used
	lastPing atomic.Int64 // written by sendLoop: the latest ping's time; 0 before the first
	answered atomic.Int64 // written by the pong handler (the reader): the latest ping answered
	pongAt   atomic.Int64 // written by the pong handler: when that answer came
	onProbe  func()       // set by OnProbe before SendLoop runs; called by sendLoop at each tick
}

func newConn(ws *websocket.Conn, bc *batchConn, maxFrame int64, keep Keepalive) *Conn {
	keep = keep.WithDefaults()
	c := &Conn{
		ws:       ws,
		bc:       bc,
		maxFrame: maxFrame,
		keep:     keep,
		sendq:    make(chan Frame, sendQueueLen),
		wake:     make(chan struct{}, 1),
		done:     make(chan struct{}),
		start:    time.Now(),
	}
	c.peerMax.Store(maxFrame) // until the peer says otherwise
	ws.SetReadLimit(maxFrame)
	ws.SetReadDeadline(time.Now().Add(keep.PongWait))
	ws.SetPongHandler(func(data string) error {
		c.pong(data)
		return ws.SetReadDeadline(time.Now().Add(keep.PongWait))
	})
	return c
}

// clock is the time since the connection began, in nanoseconds: the
// monotonic clock, which a change of the wall clock does not move.
func (c *Conn) clock() int64 { return int64(time.Since(c.start)) }

// ping sends a ping carrying its time. Pings go out every tick even while
// one is unanswered: a peer may answer only the latest of several (RFC
// 6455 allows it), and gorilla drops a pong it cannot write within a
// second; the next ping's pong then answers for the ones before it.
func (c *Conn) ping() error {
	now := c.clock()
	c.lastPing.Store(now) // before the ping leaves: its pong must find it
	var data [8]byte
	binary.BigEndian.PutUint64(data[:], uint64(now))
	return c.ws.WriteControl(websocket.PingMessage, data[:], time.Now().Add(c.keep.WriteWait))
}

// pong takes the peer's answer to a ping. A pong that carries no time of
// ours (an unsolicited one, which RFC 6455 allows) extends the read
// deadline only. Runs on the reader.
func (c *Conn) pong(data string) {
	if len(data) != 8 {
		return
	}
	t := int64(binary.BigEndian.Uint64([]byte(data)))
	if t <= c.answered.Load() || t > c.lastPing.Load() {
		return
	}
	// pongAt before answered: a Silence that finds this answer finds
	// this pong's time too, never the one before it.
	c.pongAt.Store(c.clock())
	c.answered.Store(t)
}

// Silence is how long the peer has owed a pong: zero while every ping
// sent is answered; else the time since its last pong (since the
// connection began, before the first). It counts from the last pong
// rather than from the ping still out, which may have waited up to a
// ping interval for its tick: a peer that froze just after a pong is
// silent from then on. Safe from any goroutine.
func (c *Conn) Silence() time.Duration {
	if c.answered.Load() >= c.lastPing.Load() {
		return 0
	}
	return time.Duration(c.clock() - c.pongAt.Load())
}

// OnProbe has f run on the send loop at each ping's tick, before the
// ping: a watch on Silence that costs no timer of its own. f must not
// block, nor send on c. It is set before SendLoop runs.
func (c *Conn) OnProbe(f func()) { c.onProbe = f }

// Close ends the connection once, recording why.
func (c *Conn) Close(err error) {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.closeErr = err
		c.mu.Unlock()
		close(c.done)
		c.ws.Close()
	})
}

// Cause is why the connection ended: the first reason given to Close. The
// read that fails after this end closed the connection says only "use of
// closed network connection"; this says why it was closed.
func (c *Conn) Cause() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closeErr
}

// ErrClosed is a send on a connection that ended.
var ErrClosed = errors.New("relay: connection closed")

// Done is closed when the connection ends.
func (c *Conn) Done() <-chan struct{} { return c.done }

// PeerMax is the largest frame the peer reads.
func (c *Conn) PeerMax() int64 { return c.peerMax.Load() }

// Send writes a frame, or queues it for sendLoop while another writer is
// busy, waiting while the queue is full (backpressure) until the
// connection closes or cancel is closed. The frame's Written callback runs
// exactly once whatever happens: under writeMu when this sender writes the
// frame itself, else on the goroutine that writes or drops it.
func (c *Conn) Send(f Frame, cancel <-chan struct{}) error {
	return c.SendAll([]Frame{f}, cancel)
}

// SetPeerMax records the largest frame the peer reads.
func (c *Conn) SetPeerMax(n int64) { c.peerMax.Store(n) }

// SendAll sends frames in order, as one batch when it can write them
// itself. A frame larger than the peer reads is refused (wire.ErrFrameTooLarge),
// with the frames after it: written, it would make the peer close the
// connection. Written callbacks run as for Send, under writeMu when this
// sender writes the batch itself.
func (c *Conn) SendAll(fs []Frame, cancel <-chan struct{}) error {
	peerMax := c.peerMax.Load()
	for i, f := range fs {
		if int64(len(f.Head)+len(f.Body)) > peerMax {
			for _, f := range fs[i:] {
				if f.Written != nil {
					f.Written()
				}
			}
			return wire.ErrFrameTooLarge
		}
	}
	if len(c.sendq) == 0 && c.writeMu.TryLock() {
		if len(c.sendq) == 0 {
			err := c.writeBatch(fs)
			c.writeMu.Unlock()
			return err
		}
		c.writeMu.Unlock()
	}
	for i, f := range fs {
		select {
		case c.sendq <- f:
			continue
		case <-c.done:
		case <-cancel:
		}
		for _, f := range fs[i:] {
			if f.Written != nil {
				f.Written()
			}
		}
		c.signal()
		select {
		case <-c.done:
			return ErrClosed
		default:
			return errors.New("relay: send cancelled")
		}
	}
	c.signal()
	c.dropIfClosed()
	return nil
}

// dropIfClosed releases frames queued after sendLoop stopped: a send racing
// with close may still have put one in the queue.
func (c *Conn) dropIfClosed() {
	select {
	case <-c.done:
		c.drainSendq()
	default:
	}
}

// TrySend queues a frame for sendLoop without waiting; a full queue drops
// it. For frames that may be lost (notices), from goroutines that must not
// block (read loops).
func (c *Conn) TrySend(f Frame) {
	select {
	case c.sendq <- f:
		c.signal()
		c.dropIfClosed()
	default:
		if f.Written != nil {
			f.Written()
		}
	}
}

func (c *Conn) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// SendLoop writes what senders queued while another writer was busy, and
// pings (Keepalive.pingEvery), running the OnProbe hook before each ping.
// It runs the queued frames' Written callbacks holding writeMu.
func (c *Conn) SendLoop() {
	ping := time.NewTicker(c.keep.pingEvery())
	defer ping.Stop()
	defer c.drainSendq()
	var batch []Frame // owned by sendLoop; grown only by a busy connection
	for {
		select {
		case <-c.wake:
			c.writeMu.Lock()
			var err error
			batch, err = c.writeQueued(batch)
			c.writeMu.Unlock()
			if err != nil {
				return
			}
		case <-ping.C:
			if c.onProbe != nil {
				c.onProbe() // first: a ping write stuck behind a peer that reads nothing must not hold it up
			}
			if err := c.ping(); err != nil {
				c.Close(err)
				return
			}
		case <-c.done:
			return
		}
	}
}

// writeQueued writes what is in sendq, in batches, until it is empty; batch
// is reused. The caller holds writeMu, under which the frames' Written
// callbacks run.
func (c *Conn) writeQueued(batch []Frame) ([]Frame, error) {
	for {
		batch = batch[:0]
	collect:
		for len(batch) < maxBatchFrames {
			select {
			case f := <-c.sendq:
				batch = append(batch, f)
			default:
				break collect
			}
		}
		if len(batch) == 0 {
			return batch, nil
		}
		err := c.writeBatch(batch)
		clear(batch)
		if err != nil {
			return batch, err
		}
	}
}

// Flush returns once the frames queued before it are written (each write
// has its deadline), or the connection has failed: a stopping end writes
// its close after its last answers, never ahead of them. The frames'
// Written callbacks run here, holding writeMu.
func (c *Conn) Flush() {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	c.writeQueued(nil)
}

// maxBatchFrames bounds one batch of sendLoop's, so that the frames of a
// long burst do not wait for the whole burst to be written.
const maxBatchFrames = 128

// writeBatch writes frames, each one websocket message with its own write
// deadline (a peer that stops reading is dropped instead of blocking us),
// into the batchConn's buffer, which reaches the socket in one system call.
// The written callbacks run after that, when the bytes have left the
// process, still under writeMu, which the caller holds. An error closes the
// connection.
func (c *Conn) writeBatch(fs []Frame) error {
	c.bc.begin()
	var err error
	for _, f := range fs {
		if err = c.writeOne(f); err != nil {
			break
		}
	}
	if rerr := c.bc.release(); err == nil {
		err = rerr
	}
	for _, f := range fs {
		if f.Written != nil {
			f.Written()
		}
	}
	if err != nil {
		c.Close(err)
	}
	return err
}

// writeOne writes one frame as one websocket message.
func (c *Conn) writeOne(f Frame) error {
	c.ws.SetWriteDeadline(time.Now().Add(c.keep.WriteWait))
	w, err := c.ws.NextWriter(websocket.BinaryMessage)
	if err != nil {
		return err
	}
	return writeFrame(w, f.Head, f.Body)
}

// writeFrame writes head and then body as one websocket message through w.
func writeFrame(w io.WriteCloser, head, body []byte) error {
	if _, err := w.Write(head); err != nil {
		w.Close()
		return err
	}
	if len(body) > 0 {
		if _, err := w.Write(body); err != nil {
			w.Close()
			return err
		}
	}
	return w.Close()
}

// drainSendq releases the frames left behind when sendLoop stops.
func (c *Conn) drainSendq() {
	for {
		select {
		case f := <-c.sendq:
			if f.Written != nil {
				f.Written()
			}
		default:
			return
		}
	}
}

// readFrame reads one whole message into a pooled buffer. The caller owns
// the buffer and returns it with PutBuf when done with every slice of it.
func (c *Conn) ReadFrame() (*bytes.Buffer, error) {
	typ, r, err := c.ws.NextReader()
	if err != nil {
		return nil, err
	}
	// A large frame on a slow link may take as long as its writer's
	// deadline to arrive; after it, the peer has PongWait to say more.
	c.ws.SetReadDeadline(time.Now().Add(max(c.keep.PongWait, c.keep.WriteWait)))
	if typ != websocket.BinaryMessage {
		return nil, wire.ErrMalformed
	}
	buf := GetBuf()
	if _, err := buf.ReadFrom(r); err != nil {
		PutBuf(buf)
		return nil, err
	}
	if c.keep.WriteWait > c.keep.PongWait { // an agent's: the deadline above was the longer one
		c.ws.SetReadDeadline(time.Now().Add(c.keep.PongWait))
	}
	if buf.Len() == 0 {
		PutBuf(buf)
		return nil, wire.ErrMalformed
	}
	return buf, nil
}

// WriteClose sends a close control frame with a reason, best effort.
func (c *Conn) WriteClose(code int, text string) {
	c.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, text), time.Now().Add(time.Second))
}

// Finish ends the connection after what is queued: the frames queued
// before it are written (the last answers of an end that stops), then a
// close frame with code and text, then the connection closes with err.
// Written ahead of them, the close would make the peer give up on those
// answers.
func (c *Conn) Finish(code int, text string, err error) {
	c.Flush()
	c.WriteClose(code, text)
	c.Close(err)
}

var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// maxPooledBuf keeps a burst of large bodies from pinning memory in the pool.
const maxPooledBuf = 4 << 20

// GetBuf lends a buffer from the pool that ReadFrame's buffers come from.
func GetBuf() *bytes.Buffer { return bufPool.Get().(*bytes.Buffer) }

// PutBuf returns a buffer to the pool once no slice of it is in use; nil
// is ignored.
func PutBuf(b *bytes.Buffer) {
	if b == nil || b.Cap() > maxPooledBuf {
		return
	}
	b.Reset()
	bufPool.Put(b)
}
