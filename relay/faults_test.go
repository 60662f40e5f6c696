package relay_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/calltap/calltap/cmd/stacktest"
	"github.com/calltap/calltap/relay"
	"github.com/calltap/calltap/relay/frameconn"
	"github.com/calltap/calltap/relay/polltest"
	"github.com/calltap/calltap/relay/wire"
	"github.com/gorilla/websocket"
)

// rawAgent connects to the relay with a token and speaks the protocol by
// hand, to misbehave in ways the real client never does.
func rawAgent(t *testing.T, st *stacktest.Stack, token string) *websocket.Conn {
	t.Helper()
	d := websocket.Dialer{Subprotocols: []string{wire.Subprotocol}}
	h := http.Header{"Authorization": {"Bearer " + token}}
	ws, resp, err := d.Dial(strings.Replace(st.RelayURL, "http", "ws", 1)+wire.ConnectPath, h)
	if err != nil {
		t.Fatalf("dial: %v (%v)", err, resp)
	}
	t.Cleanup(func() { ws.Close() })
	// The hello comes first.
	if _, b, err := ws.ReadMessage(); err != nil || b[0] != 0x01 {
		t.Fatalf("no hello: %v", err)
	}
	return ws
}

// readRequest waits for a request frame and returns its stream id (the
// first varint after the type byte; ids in these tests are below 128).
func readRequest(t *testing.T, ws *websocket.Conn) byte {
	t.Helper()
	for {
		_, b, err := ws.ReadMessage()
		if err != nil {
			t.Fatalf("reading request: %v", err)
		}
		if b[0] == 0x02 {
			return b[1]
		}
	}
}

func postAsync(url string) chan *http.Response { return postBodyAsync(url, "{}") }

// postBodyAsync posts body to url and sends the response on the channel
// it returns, its body read; nil if the post failed.
func postBodyAsync(url, body string) chan *http.Response {
	ch := make(chan *http.Response, 1)
	go func() {
		resp, err := http.Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			ch <- nil
			return
		}
		resp.Body.Close()
		ch <- resp
	}()
	return ch
}

func TestAgentLostMidRequest(t *testing.T) {
	st := stacktest.Start(t, stacktest.Options{ForwardTo: "http://127.0.0.1:1", NoAgent: true})

	// Lost before saving (no ack): 503, so the sender retries; never a 2xx.
	ws := rawAgent(t, st, st.Token)
	got := postAsync(st.TunnelURL)
	readRequest(t, ws)
	ws.NetConn().Close() // as if killed
	if resp := <-got; resp == nil || resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("lost before ack: %v", resp)
	}

	// Lost after saving (acked), before the handler answered: 502.
	ws = rawAgent(t, st, st.Token)
	got = postAsync(st.TunnelURL)
	stream := readRequest(t, ws)
	if err := ws.WriteMessage(websocket.BinaryMessage, []byte{0x03, stream}); err != nil {
		t.Fatal(err)
	}
	// The relay's single reader sees the ack before the connection's end.
	ws.Close()
	if resp := <-got; resp == nil || resp.StatusCode != 502 {
		t.Fatalf("lost after ack: %v", resp)
	}
}

func TestMisbehavingAgentsAffectOnlyThemselves(t *testing.T) {
	rec, h := startHandler(t, nil)
	st := stacktest.Start(t, stacktest.Options{ForwardTo: h.URL, Relay: func(c *relay.Config) { c.MaxFrame = 64 << 10 }})
	ctx := context.Background()
	cases := map[string]func(ws *websocket.Conn){
		"unknown frame type": func(ws *websocket.Conn) { ws.WriteMessage(websocket.BinaryMessage, []byte{0x7f, 1, 2, 3}) },
		"truncated response": func(ws *websocket.Conn) { ws.WriteMessage(websocket.BinaryMessage, []byte{0x04, 0x80}) },
		"text message":       func(ws *websocket.Conn) { ws.WriteMessage(websocket.TextMessage, []byte("hello")) },
		"oversized frame": func(ws *websocket.Conn) {
			ws.WriteMessage(websocket.BinaryMessage, append([]byte{0x04, 1, 200, 1, 0, 0, 0}, make([]byte, 128<<10)...))
		},
		"garbage on the socket": func(ws *websocket.Conn) { ws.NetConn().Write([]byte("\x00\xff garbage \r\n\r\n")) },
	}
	i := 0
	for name, misbehave := range cases {
		i++
		info, err := relay.CreateToken(ctx, st.RelayDB, fmt.Sprintf("mallory-%d", i), st.RelayURL)
		if err != nil {
			t.Fatal(err)
		}
		ws := rawAgent(t, st, info.Token)
		misbehave(ws)
		ws.SetReadDeadline(time.Now().Add(time.Minute))
		for {
			if _, _, err := ws.ReadMessage(); err != nil {
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					t.Errorf("%s: the relay kept the connection open", name)
				}
				break
			}
		}
		// The well-behaved tunnel is unaffected.
		resp, body := post(t, st.TunnelURL, "{}")
		if resp.StatusCode != 201 {
			t.Fatalf("after %s: the good tunnel answered %d %s", name, resp.StatusCode, body)
		}
	}
	if len(rec.all()) != len(cases) {
		t.Errorf("good tunnel delivered %d", len(rec.all()))
	}
}

func TestDeadAgentFallsBackToQueue(t *testing.T) {
	st := stacktest.Start(t, stacktest.Options{ForwardTo: "http://127.0.0.1:1", NoAgent: true, Relay: func(c *relay.Config) {
		c.Keepalive = frameconn.Keepalive{PongWait: 300 * time.Millisecond, WriteWait: 300 * time.Millisecond}
	}})
	// An agent that stops reading (a laptop asleep) never answers pings.
	rawAgent(t, st, st.Token)
	polltest.Until(t, 10*time.Second, func() bool {
		resp, err := http.Post(st.TunnelURL, "application/json", strings.NewReader("{}"))
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusAccepted
	}, "the relay did not notice the silent agent and queue")
}

func TestSlowClientsAreCutOff(t *testing.T) {
	st := stacktest.Start(t, stacktest.Options{ForwardTo: "http://127.0.0.1:1", NoAgent: true, Relay: func(c *relay.Config) {
		c.AuthTimeout = 300 * time.Millisecond
		c.MaxHeaderBytes = 4 << 10
	}})
	// Connect and say nothing (slowloris, or an agent that never authenticates).
	conn, err := net.Dial("tcp", st.RelayAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(time.Minute))
	if _, err := io.ReadAll(conn); err != nil {
		t.Fatalf("the relay did not close a silent connection: %v", err)
	}
	// An oversized request head.
	conn2, err := net.Dial("tcp", st.RelayAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close()
	fmt.Fprintf(conn2, "POST /t/%s HTTP/1.1\r\nHost: x\r\nX-Big: %s\r\n\r\n", st.TunnelID, strings.Repeat("a", 16<<10))
	resp, err := http.ReadResponse(bufio.NewReader(conn2), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("oversized head: %d, want 431", resp.StatusCode)
	}
}
