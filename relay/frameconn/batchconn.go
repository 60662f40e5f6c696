package frameconn

import (
	"net"
	"sync"
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
