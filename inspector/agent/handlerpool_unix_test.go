//go:build unix

package agent

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// strayHandler answers /first with "first" and then, each time the test
// sends on strayNow, writes an answer nobody asked for on that connection
// (an early or repeated answer); anything else it answers "fresh".
func strayHandler(t *testing.T) (addr string, strayNow chan struct{}) {
	t.Helper()
	strayNow = make(chan struct{})
	addr, _ = rawHandler(t, func(br *bufio.Reader, c net.Conn) {
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			io.Copy(io.Discard, req.Body)
			if req.URL.Path != "/first" {
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfresh")
				continue
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst")
			select {
			case <-strayNow:
			case <-t.Context().Done():
				return
			}
			io.WriteString(c, "HTTP/1.1 299 Stray\r\nContent-Length: 5\r\n\r\nstray")
		}
	})
	return addr, strayNow
}

// pooledConn is the one idle connection hc holds to addr.
func pooledConn(t *testing.T, hc *handlerClient, addr string) *handlerConn {
	t.Helper()
	hc.mu.Lock()
	defer hc.mu.Unlock()
	if n := len(hc.idle[addr]); n != 1 {
		t.Fatalf("%d idle connections to the handler, want 1", n)
	}
	return hc.idle[addr][0]
}

// An idle connection on which the handler sent bytes nobody asked for is
// not taken for the next request, whether they wait in the socket (idle
// longer than trustIdle: the socket is asked) or already in the
// connection's buffer (idle for less: the buffer is looked at): the
// request goes out on a new connection and gets its own answer, not the
// stray one.
func TestHandlerClientDropsAChattyIdleConnection(t *testing.T) {
	addr, strayNow := strayHandler(t)
	hc := newHandlerClient(5*time.Second, 1<<20)
	defer hc.closeIdle()
	post := func(path string) string {
		t.Helper()
		resp, err := postTo(t, hc, "http://"+addr+path, "{}")
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		return fmt.Sprintf("%d %s", resp.status, resp.body)
	}

	if got := post("/first"); got != "200 first" {
		t.Fatalf("/first: %q", got)
	}
	strayNow <- struct{}{}
	conn := pooledConn(t, hc, addr)
	waitReadable(t, conn)
	conn.idle = conn.idle.Add(-trustIdle) // idle that long
	if got := post("/next"); got != "200 fresh" {
		t.Errorf("stray bytes in the socket of a connection idle for trustIdle: answered %q, want 200 fresh", got)
	}

	if got := post("/first"); got != "200 first" {
		t.Fatalf("/first again: %q", got)
	}
	strayNow <- struct{}{}
	conn = pooledConn(t, hc, addr)
	waitReadable(t, conn)
	if _, err := conn.br.Peek(1); err != nil { // as when they come with the answer
		t.Fatal(err)
	}
	conn.idle = time.Now()
	if got := post("/next"); got != "200 fresh" {
		t.Errorf("stray bytes in the buffer of a connection idle for less than trustIdle: answered %q, want 200 fresh", got)
	}
}
