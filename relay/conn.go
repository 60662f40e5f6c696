package relay

import (
	"bytes"
	"errors"
	"io"
	"sort"
	"sync"
	"sync/atomic"
	"time"

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

// Keepalive holds the timing of one connection.
type Keepalive struct {
	PongWait  time.Duration // read deadline after each message or pong
	WriteWait time.Duration // deadline for writing one frame
}

func (k Keepalive) withDefaults() Keepalive {
	if k.PongWait <= 0 {
		k.PongWait = DefaultPongWait
	}
	if k.WriteWait <= 0 {
		k.WriteWait = DefaultWriteWait
	}
	return k
}

// outFrame is one message waiting in a send queue.
type outFrame struct {
	head    []byte
	body    []byte // written after head in the same message; may be nil
	written func() // called once the frame is out or dropped; may be nil
}

// wsConn is one websocket with exactly one reader (the owner's read loop,
// calling readFrame) and one writer at a time, like the readPump/writePump
// pair of gorilla's chat example.
//
// The writer is whoever holds writeMu. Usually that is sendLoop, draining
// sendq; but a sender that finds the queue empty and nobody writing writes
// its frame itself, sparing a request the hand-off to sendLoop and back —
// at one request in flight those wake-ups are most of a tunnel's latency.
// Frames leave in the order they were queued: every dequeue happens under
// writeMu, and a sender writes directly only when nothing is queued.
type wsConn struct {
	ws       *websocket.Conn
	bc       *batchConn   // the socket under ws; batches the writer's frames
	maxFrame int64        // the largest frame this end reads
	peerMax  atomic.Int64 // the largest frame the peer reads; larger sends are refused
	keep     Keepalive

	writeMu sync.Mutex    // held while frames are written; see above
	sendq   chan outFrame // bounded; dequeued only under writeMu
	wake    chan struct{} // cap 1: tells sendLoop that sendq has frames

	closeOnce sync.Once
	done      chan struct{} // closed by close
	mu        sync.Mutex
	closeErr  error // guarded by mu: why the connection ended
}

func newWSConn(ws *websocket.Conn, bc *batchConn, maxFrame int64, keep Keepalive) *wsConn {
	keep = keep.withDefaults()
	c := &wsConn{
		ws:       ws,
		bc:       bc,
		maxFrame: maxFrame,
		keep:     keep,
		sendq:    make(chan outFrame, sendQueueLen),
		wake:     make(chan struct{}, 1),
		done:     make(chan struct{}),
	}
	c.peerMax.Store(maxFrame) // until the peer says otherwise
	ws.SetReadLimit(maxFrame)
	ws.SetReadDeadline(time.Now().Add(keep.PongWait))
	ws.SetPongHandler(func(string) error {
		return ws.SetReadDeadline(time.Now().Add(keep.PongWait))
	})
	return c
}

// close ends the connection once, recording why.
func (c *wsConn) close(err error) {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.closeErr = err
		c.mu.Unlock()
		close(c.done)
		c.ws.Close()
	})
}

// cause is why the connection ended: the first reason given to close. The
// read that fails after this end closed the connection says only "use of
// closed network connection"; this says why it was closed.
func (c *wsConn) cause() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closeErr
}

var errConnClosed = errors.New("relay: connection closed")

// send writes a frame, or queues it for sendLoop while another writer is
// busy, waiting while the queue is full (backpressure) until the
// connection closes or cancel is closed. The frame's written callback runs
// exactly once whatever happens.
func (c *wsConn) send(f outFrame, cancel <-chan struct{}) error {
	return c.sendAll([]outFrame{f}, cancel)
}

// setPeerMax records the largest frame the peer reads.
func (c *wsConn) setPeerMax(n int64) { c.peerMax.Store(n) }

// sendAll sends frames in order, as one batch when it can write them
// itself. A frame larger than the peer reads is refused (errFrameTooLarge),
// with the frames after it: written, it would make the peer close the
// connection.
func (c *wsConn) sendAll(fs []outFrame, cancel <-chan struct{}) error {
	peerMax := c.peerMax.Load()
	for i, f := range fs {
		if int64(len(f.head)+len(f.body)) > peerMax {
			for _, f := range fs[i:] {
				if f.written != nil {
					f.written()
				}
			}
			return errFrameTooLarge
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
			if f.written != nil {
				f.written()
			}
		}
		c.signal()
		select {
		case <-c.done:
			return errConnClosed
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
func (c *wsConn) dropIfClosed() {
	select {
	case <-c.done:
		c.drainSendq()
	default:
	}
}

// trySend queues a frame for sendLoop without waiting; a full queue drops
// it. For frames that may be lost (notices), from goroutines that must not
// block (read loops).
func (c *wsConn) trySend(f outFrame) {
	select {
	case c.sendq <- f:
		c.signal()
		c.dropIfClosed()
	default:
		if f.written != nil {
			f.written()
		}
	}
}

func (c *wsConn) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// sendLoop writes what senders queued while another writer was busy, and
// pings at 9/10 of the pong wait.
func (c *wsConn) sendLoop() {
	ping := time.NewTicker(c.keep.PongWait * 9 / 10)
	defer ping.Stop()
	defer c.drainSendq()
	var batch []outFrame // owned by sendLoop; grown only by a busy connection
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
			if err := c.ws.WriteControl(websocket.PingMessage, nil, time.Now().Add(c.keep.WriteWait)); err != nil {
				c.close(err)
				return
			}
		case <-c.done:
			return
		}
	}
}

// writeQueued writes what is in sendq, in batches, until it is empty; batch
// is reused. The caller holds writeMu.
func (c *wsConn) writeQueued(batch []outFrame) ([]outFrame, error) {
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

// flush returns once the frames queued before it are written (each write
// has its deadline), or the connection has failed: a stopping end writes
// its close after its last answers, never ahead of them.
func (c *wsConn) flush() {
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
// process. The caller holds writeMu. An error closes the connection.
func (c *wsConn) writeBatch(fs []outFrame) error {
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
		if f.written != nil {
			f.written()
		}
	}
	if err != nil {
		c.close(err)
	}
	return err
}

// writeOne writes one frame as one websocket message.
func (c *wsConn) writeOne(f outFrame) error {
	c.ws.SetWriteDeadline(time.Now().Add(c.keep.WriteWait))
	w, err := c.ws.NextWriter(websocket.BinaryMessage)
	if err != nil {
		return err
	}
	return writeFrame(w, f.head, f.body)
}

// drainSendq releases the frames left behind when sendLoop stops.
func (c *wsConn) drainSendq() {
	for {
		select {
		case f := <-c.sendq:
			if f.written != nil {
				f.written()
			}
		default:
			return
		}
	}
}

// readFrame reads one whole message into a pooled buffer. The caller owns
// the buffer and returns it with putBuf when done with every slice of it.
func (c *wsConn) readFrame() (*bytes.Buffer, error) {
	typ, r, err := c.ws.NextReader()
	if err != nil {
		return nil, err
	}
	// A large frame on a slow link may take as long as its writer's
	// deadline to arrive; after it, the peer has PongWait to say more.
	c.ws.SetReadDeadline(time.Now().Add(max(c.keep.PongWait, c.keep.WriteWait)))
	if typ != websocket.BinaryMessage {
		return nil, errMalformed
	}
	buf := getBuf()
	if _, err := buf.ReadFrom(r); err != nil {
		putBuf(buf)
		return nil, err
	}
	if c.keep.WriteWait > c.keep.PongWait { // an agent's: the deadline above was the longer one
		c.ws.SetReadDeadline(time.Now().Add(c.keep.PongWait))
	}
	if buf.Len() == 0 {
		putBuf(buf)
		return nil, errMalformed
	}
	return buf, nil
}

// writeClose sends a close control frame with a reason, best effort.
func (c *wsConn) writeClose(code int, text string) {
	c.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, text), time.Now().Add(time.Second))
}

var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// maxPooledBuf keeps a burst of large bodies from pinning memory in the pool.
const maxPooledBuf = 4 << 20

func getBuf() *bytes.Buffer { return bufPool.Get().(*bytes.Buffer) }

func putBuf(b *bytes.Buffer) {
	if b == nil || b.Cap() > maxPooledBuf {
		return
	}
	b.Reset()
	bufPool.Put(b)
}

// readAllPooled reads r (at most max bytes; more is errTooLarge) into a pooled buffer.
func readAllPooled(r io.Reader, max int64) (*bytes.Buffer, error) {
	buf := getBuf()
	n, err := buf.ReadFrom(io.LimitReader(r, max+1))
	if err != nil {
		putBuf(buf)
		return nil, err
	}
	if n > max {
		putBuf(buf)
		return nil, errTooLarge
	}
	return buf, nil
}

var errTooLarge = errors.New("relay: body too large")

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
