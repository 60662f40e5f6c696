package relay_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/calltap/calltap/cmd/stacktest"
	"github.com/calltap/calltap/relay"
	"github.com/calltap/calltap/relay/polltest"
)

// trickle is one raw connection that sends a request head announcing a
// 100 kB body, then the body a byte every 100 ms, until it is answered.
type trickle struct {
	status               int
	code                 string
	retryAfter           string
	close                bool // the answer said Connection: close
	answeredAt, closedAt time.Time
	err                  error
}

func (tr *trickle) run(addr, path string, start time.Time) {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		tr.err = err
		return
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 100000\r\n\r\n", path)
	answered := make(chan struct{})
	go func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				if _, err := conn.Write([]byte("a")); err != nil {
					return
				}
			case <-answered:
				return
			}
		}
	}()
	// Bounds a hang; the answers are expected within seconds.
	conn.SetReadDeadline(start.Add(40 * time.Second))
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	close(answered)
	if err != nil {
		tr.err = err
		return
	}
	tr.answeredAt = time.Now()
	// ReadResponse takes "Connection: close" out of the header into Close.
	tr.status, tr.retryAfter, tr.close = resp.StatusCode, resp.Header.Get("Retry-After"), resp.Close
	var env struct {
		Error struct{ Code string } `json:"error"`
	}
	json.NewDecoder(resp.Body).Decode(&env)
	tr.code = env.Error.Code
	// Then the relay closes the connection.
	if _, err := io.Copy(io.Discard, br); err == nil {
		tr.closedAt = time.Now()
	} else {
		tr.err = fmt.Errorf("after the answer: %w", err)
	}
}

// Fifty senders trickling a body a byte at a time: those over the rate
// limit get 429 with Retry-After at once, the others 408 once the grace
// is over, and each connection is then closed; none waits for the read
// timeout (a minute here).
func TestSlowSendersAreAnsweredAtOnce(t *testing.T) {
	rec, h := startHandler(t, nil)
	st := stacktest.Start(t, stacktest.Options{ForwardTo: h.URL, Relay: func(c *relay.Config) {
		c.RateLimit, c.RateBurst = 0.001, 10
		c.BodyGrace = 500 * time.Millisecond
		c.MinBodyRate = 1000
		c.MaxSlowBodies = 2
	}})
	path := "/t/" + st.TunnelID + "/slow"
	const n = 50
	senders := make([]trickle, n)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range senders {
		wg.Add(1)
		go func() { defer wg.Done(); senders[i].run(st.RelayAddr, path, start) }()
	}
	wg.Wait()
	counts := map[string]int{}
	for i, s := range senders {
		if s.err != nil {
			t.Errorf("sender %d: %v", i, s.err)
			continue
		}
		counts[fmt.Sprintf("%d %s", s.status, s.code)]++
		if !s.close {
			t.Errorf("sender %d: %d without Connection: close", i, s.status)
		}
		if s.status == http.StatusTooManyRequests && s.retryAfter == "" {
			t.Errorf("sender %d: 429 without Retry-After", i)
		}
		// Far below the minute the read timeout allows: the answer came
		// when the grace and the rate said, not when the timeout did.
		if d := s.answeredAt.Sub(start); d > 20*time.Second {
			t.Errorf("sender %d: answered %d after %s", i, s.status, d)
		}
	}
	if counts["429 rate_limited"] != n-10 || counts["408 request_timeout"] != 10 {
		t.Errorf("answers %v, want %d × 429 rate_limited and 10 × 408 request_timeout", counts, n-10)
	}
	if got := rec.all(); len(got) != 0 {
		t.Errorf("the handler saw %d slow bodies", len(got))
	}
}

// A client that writes its whole oversized body before it reads, as
// Python's http.client does, gets its 413 rather than a broken pipe or a
// reset: the relay reads and drops the rest before closing.
func TestOversizedBodyWrittenWholeGets413(t *testing.T) {
	_, h := startHandler(t, nil)
	st := stacktest.Start(t, stacktest.Options{ForwardTo: h.URL, Relay: func(c *relay.Config) {
		c.MaxBody = 1 << 20
	}})
	const size = 24 << 20 // more than the sockets on both sides buffer
	body := bytes.Repeat([]byte("x"), size)
	for _, chunked := range []bool{false, true} {
		var req bytes.Buffer
		req.Grow(size + size/8)
		fmt.Fprintf(&req, "POST /t/%s/big HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n", st.TunnelID)
		if chunked {
			// The relay finds out only after reading MaxBody of it.
			req.WriteString("Transfer-Encoding: chunked\r\n\r\n")
			for off := 0; off < size; off += 1 << 16 {
				fmt.Fprintf(&req, "%x\r\n", 1<<16)
				req.Write(body[off : off+1<<16])
				req.WriteString("\r\n")
			}
			req.WriteString("0\r\n\r\n")
		} else {
			fmt.Fprintf(&req, "Content-Length: %d\r\n\r\n", size)
			req.Write(body)
		}
		// Dialled once the request is built: the relay gives a silent
		// connection only its header timeout, and building 24 MiB takes
		// seconds under the race detector.
		conn, err := net.Dial("tcp", st.RelayAddr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(60 * time.Second)) // bounds a hang
		if _, err := conn.Write(req.Bytes()); err != nil {
			t.Fatalf("chunked=%v: writing the whole request: %v", chunked, err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("chunked=%v: reading the answer: %v", chunked, err)
		}
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusRequestEntityTooLarge || errorCode(t, string(b)) != "payload_too_large" || !resp.Close {
			t.Errorf("chunked=%v: %d %s (close %v), want 413 payload_too_large and Connection: close", chunked, resp.StatusCode, b, resp.Close)
		}
	}
	// The tunnel still serves.
	polltest.Until(t, 10*time.Second, func() bool {
		resp, _ := post(t, st.TunnelURL, "{}")
		return resp.StatusCode == http.StatusCreated
	}, "the tunnel did not serve after the refusals")
}
