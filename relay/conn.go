package relay

import (
	"bytes"
	"errors"
	"io"
	"sort"
	"sync"
	"time"

	"github.com/gorilla/websocket"
)

// Keepalive defaults. The relay must notice a dead agent (laptop asleep,
// cable pulled) within 45 s: a pong must arrive within PongWait of the last
// message, and pings go out at 9/10 of that.
const (
	DefaultPongWait  = 30 * time.Second
	DefaultWriteWait = 10 * time.Second
	sendQueueLen     = 256
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
	written func() // called by sendLoop once the frame is out or dropped; may be nil
}

// wsConn is one websocket with exactly one reader (the owner's read loop,
// calling readFrame) and one writer (sendLoop). Both ends of the tunnel use
// it, like the readPump/writePump pair of gorilla's chat example.
type wsConn struct {
	ws       *websocket.Conn
	maxFrame int64
	keep     Keepalive

	sendq chan outFrame // bounded; drained by sendLoop only

	closeOnce sync.Once
	done      chan struct{} // closed by close
	mu        sync.Mutex
	closeErr  error // guarded by mu: why the connection ended
}

func newWSConn(ws *websocket.Conn, maxFrame int64, keep Keepalive) *wsConn {
	keep = keep.withDefaults()
	c := &wsConn{
		ws:       ws,
		maxFrame: maxFrame,
		keep:     keep,
		sendq:    make(chan outFrame, sendQueueLen),
		done:     make(chan struct{}),
	}
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

// err reports why the connection closed (nil while open).
func (c *wsConn) err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closeErr
}

var errConnClosed = errors.New("relay: connection closed")

// send queues a frame, waiting while the queue is full (backpressure), until
// the connection closes or cancel is closed. The frame's written callback
// runs exactly once whatever happens.
func (c *wsConn) send(f outFrame, cancel <-chan struct{}) error {
	if int64(len(f.head)+len(f.body)) > c.maxFrame {
		if f.written != nil {
			f.written()
		}
		return errFrameTooLarge
	}
	select {
	case c.sendq <- f:
		return nil
	case <-c.done:
	case <-cancel:
	}
	if f.written != nil {
		f.written()
	}
	select {
	case <-c.done:
		return errConnClosed
	default:
		return errors.New("relay: send cancelled")
	}
}

// sendLoop is the connection's only writer: frames from sendq, and pings at
// 9/10 of the pong wait. Each write has its own deadline, so a peer that
// stops reading is dropped instead of blocking us forever.
func (c *wsConn) sendLoop() {
	ping := time.NewTicker(c.keep.PongWait * 9 / 10)
	defer ping.Stop()
	defer c.drainSendq()
	for {
		select {
		case f := <-c.sendq:
			c.ws.SetWriteDeadline(time.Now().Add(c.keep.WriteWait))
			w, err := c.ws.NextWriter(websocket.BinaryMessage)
			if err == nil {
				err = writeFrame(w, f.head, f.body)
			}
			if f.written != nil {
				f.written()
			}
			if err != nil {
				c.close(err)
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
	c.ws.SetReadDeadline(time.Now().Add(c.keep.PongWait))
	if typ != websocket.BinaryMessage {
		return nil, errMalformed
	}
	buf := getBuf()
	if _, err := buf.ReadFrom(r); err != nil {
		putBuf(buf)
		return nil, err
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
