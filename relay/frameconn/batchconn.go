package frameconn

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"sync"

	"github.com/gorilla/websocket"
)

// batchConn is the network connection under a tunnel's websocket. While
// SendLoop holds it (hold), writes collect in one buffer and reach the
// socket in a single system call at release, so a burst of frames — acks,
// requests, responses of many streams — costs one write, not one each.
// Outside a hold it writes straight through (the handshake, a close frame
// sent while nothing else is being written).
//
// Profiles of tunnels carrying small requests put most of their CPU in
// socket writes and the wake-ups around them; this is the cheapest place
// to cut them, below gorilla/websocket, which writes every message with a
// system call of its own.
type batchConn struct {
	net.Conn

	mu   sync.Mutex // guards hold and buf: the writer's batch, and a close frame written outside it
	hold bool       // guarded by mu: set by the writer for the length of a batch
	buf  []byte     // guarded by mu: bytes written during the hold, not yet sent
}

// batchFlushAt sends the buffer early once it holds this much: beyond it a
// bigger buffer saves no system calls worth having and only costs memory.
const batchFlushAt = 64 << 10

func newBatchConn(c net.Conn) *batchConn { return &batchConn{Conn: c} }

func (b *batchConn) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.hold {
		return b.Conn.Write(p)
	}
	if len(b.buf)+len(p) > batchFlushAt {
		if err := b.flushLocked(); err != nil {
			return 0, err
		}
		if len(p) >= batchFlushAt {
			// A large body goes out as it is, not through the buffer.
			return b.Conn.Write(p)
		}
	}
	if b.buf == nil {
		b.buf = (*batchBufs.Get().(*[]byte))[:0]
	}
	b.buf = append(b.buf, p...)
	return len(p), nil
}

// batchBufs lends the buffers: only connections in the middle of a batch
// hold one, so ten thousand idle tunnels hold none.
var batchBufs = sync.Pool{New: func() any { b := make([]byte, 0, batchFlushAt); return &b }}

// begin starts collecting writes.
func (b *batchConn) begin() {
	b.mu.Lock()
	b.hold = true
	b.mu.Unlock()
}

// release sends what was collected and goes back to writing straight through.
func (b *batchConn) release() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.hold = false
	err := b.flushLocked()
	if b.buf != nil {
		buf := b.buf
		batchBufs.Put(&buf)
		b.buf = nil
	}
	return err
}

func (b *batchConn) flushLocked() error {
	if len(b.buf) == 0 {
		return nil
	}
	_, err := b.Conn.Write(b.buf)
	b.buf = b.buf[:0]
	return err
}

// Accept upgrades an agent's request to a websocket over a batchConn
// (up answers the request itself when it cannot) and returns it as a Conn
// reading frames up to maxFrame.
func Accept(up *websocket.Upgrader, w http.ResponseWriter, r *http.Request, maxFrame int64, keep Keepalive) (*Conn, error) {
	hw := &hijackBatch{ResponseWriter: w}
	ws, err := up.Upgrade(hw, r, nil)
	if err != nil {
		return nil, err
	}
	return newConn(ws, hw.bc, maxFrame, keep), nil
}

// Dial opens a websocket to url with d, over a batchConn around the
// connection d's NetDialContext (or a plain net.Dialer) makes, and returns
// it as a Conn reading frames up to maxFrame. The response is the
// handshake's, for the caller to read why it failed.
func Dial(ctx context.Context, d websocket.Dialer, url string, h http.Header, maxFrame int64, keep Keepalive) (*Conn, *http.Response, error) {
	var bc *batchConn
	dial := d.NetDialContext
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	d.NetDialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		bc = newBatchConn(conn)
		return bc, nil
	}
	ws, resp, err := d.DialContext(ctx, url, h)
	if err != nil {
		return nil, resp, err
	}
	return newConn(ws, bc, maxFrame, keep), resp, nil
}

// hijackBatch hands the upgrader a batchConn over the hijacked connection,
// so that the writer can batch its writes.
type hijackBatch struct {
	http.ResponseWriter
	bc *batchConn // set by Hijack
}

func (h *hijackBatch) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	hj, ok := h.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("relay: connection cannot be hijacked")
	}
	conn, brw, err := hj.Hijack()
	if err != nil {
		return nil, nil, err
	}
	h.bc = newBatchConn(conn)
	return h.bc, brw, nil
}
