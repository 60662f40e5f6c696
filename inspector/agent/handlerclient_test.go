package agent

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// rawHandler serves each connection with answer, a function that reads
// requests from it and writes whatever bytes it likes back: a handler that
// misbehaves exactly as asked. It returns the address and the number of
// connections accepted.
// do is doLimited with the client's own body limit, as the tests send.
func (hc *handlerClient) do(ctx context.Context, req *http.Request) (*handlerResponse, error) {
	return hc.doLimited(ctx, req, hc.maxBody, nil)
}

func rawHandler(t *testing.T, answer func(br *bufio.Reader, c net.Conn)) (string, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var conns atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer c.Close()
				answer(bufio.NewReader(c), c)
			}()
		}
	}()
	return ln.Addr().String(), &conns
}

func postTo(t *testing.T, hc *handlerClient, u, body string) (*handlerResponse, error) {
	t.Helper()
	req, err := http.NewRequest("POST", u, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return hc.do(context.Background(), req)
}

func TestHandlerClientKeepsConnectionsAlive(t *testing.T) {
	var conns atomic.Int64
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			w.Header().Add("X-Seen", "1")
			w.Header().Add("X-Seen", "2")
			w.WriteHeader(201)
			w.Write(bytes.ToUpper(b))
		}),
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				conns.Add(1)
			}
		},
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	hc := newHandlerClient(5*time.Second, 1<<20)
	defer hc.closeIdle()
	for i := range 5 {
		resp, err := postTo(t, hc, "http://"+ln.Addr().String()+"/hook?x=1", "hello")
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if resp.status != 201 || string(resp.body) != "HELLO" || len(resp.header.Values("X-Seen")) != 2 {
			t.Fatalf("request %d: %d %q %v", i, resp.status, resp.body, resp.header)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("5 sequential requests used %d connections, want 1", n)
	}
}

func TestHandlerClientHandlerClosedIdleConnection(t *testing.T) {
	// Answers one request with keep-alive, then closes: the next request
	// must go out on a new connection and succeed.
	addr, conns := rawHandler(t, func(br *bufio.Reader, c net.Conn) {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		io.Copy(io.Discard, req.Body)
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	})
	hc := newHandlerClient(5*time.Second, 1<<20)
	defer hc.closeIdle()
	for i := range 3 {
		resp, err := postTo(t, hc, "http://"+addr+"/", "{}")
		if err != nil || resp.status != 200 || string(resp.body) != "ok" {
			t.Fatalf("request %d: %v %+v", i, err, resp)
		}
	}
	if n := conns.Load(); n != 3 {
		t.Errorf("connections: %d, want 3", n)
	}
}

func TestHandlerClientChunkedAfterEarlyHints(t *testing.T) {
	addr, _ := rawHandler(t, func(br *bufio.Reader, c net.Conn) {
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			io.Copy(io.Discard, req.Body)
			io.WriteString(c, "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"+
				"HTTP/1.1 202 Accepted\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
		}
	})
	hc := newHandlerClient(5*time.Second, 1<<20)
	defer hc.closeIdle()
	for i := range 2 {
		resp, err := postTo(t, hc, "http://"+addr+"/", "{}")
		if err != nil || resp.status != 202 || string(resp.body) != "hello world" {
			t.Fatalf("request %d: %v %+v", i, err, resp)
		}
	}
}

func TestHandlerClientLimitsAndTimeouts(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	addr, _ := rawHandler(t, func(br *bufio.Reader, c net.Conn) {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		io.Copy(io.Discard, req.Body)
		switch req.URL.Path {
		case "/big":
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n"+strings.Repeat("x", 100))
		case "/slow":
			<-release
		}
	})
	hc := newHandlerClient(300*time.Millisecond, 10)
	defer hc.closeIdle()
	_, err := postTo(t, hc, "http://"+addr+"/big", "{}")
	if err == nil || !strings.Contains(err.Error(), "larger than 10 bytes") {
		t.Errorf("a 100-byte answer with a 10-byte limit: %v", err)
	}
	_, err = postTo(t, hc, "http://"+addr+"/slow", "{}")
	var ue *url.Error
	if !errors.As(err, &ue) || !ue.Timeout() {
		t.Errorf("a handler that never answers: %v, want a timeout", err)
	}
	// A cancelled context ends the exchange and says so.
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+addr+"/slow", strings.NewReader("{}"))
	slow := newHandlerClient(time.Minute, 10)
	defer slow.closeIdle()
	done := make(chan error, 1)
	go func() { _, err := slow.do(ctx, req); done <- err }()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v, want context.Canceled", err)
	}
	// Nobody listening: the error names the method and URL, as net/http's does.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := ln.Addr().String()
	ln.Close()
	_, err = postTo(t, hc, "http://"+dead+"/x", "{}")
	if err == nil || !strings.HasPrefix(err.Error(), `Post "http://`+dead+`/x"`) || !strings.Contains(err.Error(), "refused") {
		t.Errorf("nobody listening: %v", err)
	}
}

// An in-memory body leaves from its own slice (reqWriter) and arrives
// whole, with its length, small or large, and the connection stays usable
// for the next request.
func TestHandlerClientSendsBodiesWhole(t *testing.T) {
	got := make(chan []byte, 4)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil || r.ContentLength != int64(len(b)) {
			w.WriteHeader(400)
			return
		}
		got <- b
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	hc := newHandlerClient(10*time.Second, 8<<20)
	for _, n := range []int{0, 1, 4096, 1<<20 + 7} {
		body := bytes.Repeat([]byte{'a', 0, 0xff}, n/3+1)[:n]
		req, err := http.NewRequest("POST", "http://"+ln.Addr().String()+"/x", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := hc.do(context.Background(), req)
		if err != nil || resp.status != 200 {
			t.Fatalf("%d bytes: %+v, %v", n, resp, err)
		}
		if b := <-got; !bytes.Equal(b, body) {
			t.Errorf("%d bytes sent, %d arrived (or not the same)", n, len(b))
		}
	}
}

// A response body of exactly the limit is an answer, not an error.
func TestHandlerClientBodyAtTheLimit(t *testing.T) {
	addr, _ := rawHandler(t, func(br *bufio.Reader, c net.Conn) {
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			io.Copy(io.Discard, req.Body)
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789")
		}
	})
	hc := newHandlerClient(5*time.Second, 10)
	defer hc.closeIdle()
	resp, err := postTo(t, hc, "http://"+addr+"/", "{}")
	if err != nil || resp.status != 200 || string(resp.body) != "0123456789" {
		t.Fatalf("a 10-byte answer with a 10-byte limit: %+v, %v", resp, err)
	}
}

// A request without a body is tried again on a new connection when the
// kept-alive one it went out on had been closed by the handler, as one
// with a body is.
func TestHandlerClientRetriesABodilessRequest(t *testing.T) {
	addr, conns := rawHandler(t, func(br *bufio.Reader, c net.Conn) {
		if _, err := http.ReadRequest(br); err == nil {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	hc := newHandlerClient(5*time.Second, 1<<20)
	defer hc.closeIdle()
	for i := range 3 {
		req, err := http.NewRequest("GET", "http://"+addr+"/", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := hc.do(context.Background(), req)
		if err != nil || resp.status != 200 || string(resp.body) != "ok" {
			t.Fatalf("request %d: %v %+v", i, err, resp)
		}
	}
	if n := conns.Load(); n != 3 {
		t.Errorf("connections: %d, want 3", n)
	}
}

// The pool keeps at most maxIdlePerHost idle connections to a handler and
// closes any more it is given back.
func TestHandlerClientIdleLimit(t *testing.T) {
	addr, _ := rawHandler(t, func(br *bufio.Reader, c net.Conn) { io.Copy(io.Discard, br) })
	hc := newHandlerClient(5*time.Second, 1<<20)
	defer hc.closeIdle()
	conns := make([]*handlerConn, maxIdlePerHost+1)
	for i := range conns {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		conns[i] = &handlerConn{Conn: c, addr: addr, br: bufio.NewReader(c), bw: bufio.NewWriter(c)}
		hc.put(conns[i])
	}
	hc.mu.Lock()
	n := len(hc.idle[addr])
	hc.mu.Unlock()
	if n != maxIdlePerHost {
		t.Errorf("%d idle connections kept, want %d", n, maxIdlePerHost)
	}
	if _, err := conns[maxIdlePerHost].Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Errorf("the connection over the limit: write %v, want it closed", err)
	}
}
