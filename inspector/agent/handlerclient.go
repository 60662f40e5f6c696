package agent

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"time"
)

// handlerClient sends requests to the developer's local handler over
// pooled keep-alive connections and reads each answer in the calling
// goroutine. net/http's Transport passes every request through two
// goroutines of its connection (a writer and a reader) and back; at one
// request in flight those hand-offs cost several times what the handler
// itself takes on loopback. The wire format is still net/http's own:
// Request.Write and ReadResponse. Plain http only; https targets go
// through the ordinary client.
type handlerClient struct {
	timeout time.Duration // the whole exchange, dial included
	maxBody int64         // a larger response body is an error
	dialer  net.Dialer

	mu   sync.Mutex
	idle map[string][]*handlerConn // guarded by mu: idle connections by host:port, most recent last
}

// handlerConn is one keep-alive connection to a handler.
type handlerConn struct {
	net.Conn
	addr string // the pool's key: host:port as the target names it
	br   *bufio.Reader
	bw   *bufio.Writer
	idle time.Time // when it went back to the pool
}

// trustIdle is how long an idle connection is taken without asking the
// socket whether the handler closed it (alive: one system call, a ninth of
// a request's at load). Handlers close idle connections after seconds
// (Node 5 s, Python's servers 2–5 s); one closed sooner fails the write or
// the read, and do tries once more on a new connection.
const trustIdle = 500 * time.Millisecond

const maxIdlePerHost = 64

func newHandlerClient(timeout time.Duration, maxBody int64) *handlerClient {
	return &handlerClient{timeout: timeout, maxBody: maxBody, idle: map[string][]*handlerConn{},
		dialer: net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}}
}

// handlerResponse is what the handler answered, its body read whole.
type handlerResponse struct {
	status int
	header http.Header
	body   []byte
}

// bodyTooLargeError is returned for a response body over the limit; only
// that much (and one byte) was read.
type bodyTooLargeError struct{ limit int64 }

func (e *bodyTooLargeError) Error() string {
	return fmt.Sprintf("the response body is larger than %d bytes", e.limit)
}

// doLimited sends req (an http URL, a body of known length) and reads the
// answer, at most maxBody bytes of it. Errors are *url.Error, as net/http's
// client returns them. sent, if not nil,
// is called when the request has been written whole, before its answer is
// read: work done there overlaps the handler's. A try again on a new
// connection writes the request, and calls sent, again.
func (hc *handlerClient) doLimited(ctx context.Context, req *http.Request, maxBody int64, sent func()) (*handlerResponse, error) {
	addr := req.URL.Host
	if req.URL.Port() == "" {
		addr = net.JoinHostPort(req.URL.Hostname(), "80")
	}
	deadline := time.Now().Add(hc.timeout)
	for try := 0; ; try++ {
		conn, reused, err := hc.get(ctx, addr)
		if err != nil {
			return nil, hc.urlError(req, err)
		}
		if try > 0 && req.GetBody != nil {
			if req.Body, err = req.GetBody(); err != nil {
				conn.Close()
				return nil, hc.urlError(req, err)
			}
		}
		resp, err := hc.exchange(ctx, conn, req, deadline, maxBody, sent)
		if err == nil {
			return resp, nil
		}
		if ctx.Err() != nil {
			// Cancelled (the deadline set to stop the exchange made it a
			// time-out): say so, as net/http's client does.
			return nil, hc.urlError(req, ctx.Err())
		}
		// A kept-alive connection the handler closed just as we wrote
		// never had the request read: try once more on a new one.
		if reused && try == 0 && staleConn(err) && (req.Body == nil || req.GetBody != nil) {
			continue
		}
		return nil, hc.urlError(req, err)
	}
}

func (hc *handlerClient) exchange(ctx context.Context, conn *handlerConn, req *http.Request, deadline time.Time, maxBody int64, sent func()) (*handlerResponse, error) {
	conn.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	keep := false
	defer func() {
		if keep && ctx.Err() == nil {
			hc.put(conn)
		} else {
			conn.Close()
		}
	}()
	if err := req.Write(reqWriter{conn.bw}); err != nil {
		return nil, err
	}
	if err := conn.bw.Flush(); err != nil {
		return nil, err
	}
	if sent != nil {
		sent()
	}
	var resp *http.Response
	for {
		var err error
		if resp, err = http.ReadResponse(conn.br, req); err != nil {
			return nil, err
		}
		if resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			break
		}
		resp.Body.Close() // an informational answer (103): the real one follows
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	if int64(len(body)) > maxBody {
		return nil, &bodyTooLargeError{maxBody}
	}
	keep = !resp.Close && !req.Close && resp.StatusCode != http.StatusSwitchingProtocols
	return &handlerResponse{status: resp.StatusCode, header: resp.Header, body: body}, nil
}

// reqWriter is what a request is written to: the connection's buffered
// writer, and a ReadFrom that sends an in-memory body from its own slice.
// net/http writes a body with io.Copy from a LimitedReader, which a
// bufio.Writer and a TCP connection copy through a 32 KiB buffer: a copy
// of every byte, 12% of the agent's CPU with 1 MiB bodies.
type reqWriter struct{ *bufio.Writer }

func (w reqWriter) ReadFrom(r io.Reader) (int64, error) {
	if lr, ok := r.(*io.LimitedReader); ok {
		if br, ok := lr.R.(*bytes.Reader); ok && int64(br.Len()) <= lr.N {
			n, err := br.WriteTo(w.Writer)
			lr.N -= n
			return n, err
		}
	}
	return w.Writer.ReadFrom(r)
}

// get returns a live idle connection to addr, or dials one.
func (hc *handlerClient) get(ctx context.Context, addr string) (*handlerConn, bool, error) {
	for {
		hc.mu.Lock()
		list := hc.idle[addr]
		var conn *handlerConn
		if n := len(list); n > 0 {
			conn = list[n-1]
			list[n-1] = nil
			hc.idle[addr] = list[:n-1]
		}
		hc.mu.Unlock()
		if conn == nil {
			break
		}
		if (time.Since(conn.idle) < trustIdle && conn.br.Buffered() == 0) || conn.alive() {
			return conn, true, nil
		}
		conn.Close()
	}
	c, err := hc.dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, false, err
	}
	return &handlerConn{Conn: c, addr: addr, br: bufio.NewReaderSize(c, 16<<10), bw: bufio.NewWriterSize(c, 16<<10)}, false, nil
}

func (hc *handlerClient) put(conn *handlerConn) {
	conn.SetDeadline(time.Time{})
	conn.idle = time.Now()
	hc.mu.Lock()
	defer hc.mu.Unlock()
	if len(hc.idle[conn.addr]) >= maxIdlePerHost {
		conn.Close()
		return
	}
	hc.idle[conn.addr] = append(hc.idle[conn.addr], conn)
}

// closeIdle closes the idle connections.
func (hc *handlerClient) closeIdle() {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	for addr, list := range hc.idle {
		for _, c := range list {
			c.Close()
		}
		delete(hc.idle, addr)
	}
}

// staleConn reports an error of a connection the other side had closed.
func staleConn(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// failureCause names in words why a try at the handler got no answer,
// or "" when the error says nothing plainer than its own text.
func failureCause(err error, timeout bool) string {
	var dnsErr *net.DNSError
	switch {
	case timeout:
		return "timed out"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused (is the handler running?)"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset by the handler"
	case errors.Is(err, syscall.EPIPE):
		return "connection closed by the handler while sending"
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return "connection closed by the handler before its answer"
	case errors.As(err, &dnsErr):
		return "host not found"
	case errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH):
		return "host unreachable"
	}
	return ""
}

func (hc *handlerClient) urlError(req *http.Request, err error) error {
	op := req.Method[:1] + strings.ToLower(req.Method[1:])
	return &url.Error{Op: op, URL: req.URL.String(), Err: err}
}
