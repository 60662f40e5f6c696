package relay_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/calltap/calltap/inspector/inspectortest"
	"github.com/calltap/calltap/relay"
	"github.com/gorilla/websocket"
)

func TestRefusedSendersCountAgainstRateLimit(t *testing.T) {
	rec, h := startHandler(t, nil)
	st := inspectortest.Start(t, inspectortest.Options{ForwardTo: h.URL,
		Relay: func(c *relay.Config) {
			// A token every 100 s: none comes back while the test runs.
			c.RateLimit, c.RateBurst = 0.01, 5
		},
		Client: func(c *relay.ClientConfig) { c.RequireHeaders = []string{"X-Secret: s3cret"} },
	})
	for i := 0; i < 5; i++ {
		resp, body := post(t, st.TunnelURL, "{}")
		if resp.StatusCode != 401 || errorCode(t, body) != "sender_not_accepted" {
			t.Fatalf("refusal %d: %d %s", i, resp.StatusCode, body)
		}
	}
	resp, body := post(t, st.TunnelURL, "{}")
	if resp.StatusCode != 429 || errorCode(t, body) != "rate_limited" {
		t.Fatalf("after the burst of refusals: %d %s, want 429", resp.StatusCode, body)
	}
	// The flood spent the tunnel's allowance, a good sender included.
	req, _ := http.NewRequest("POST", st.TunnelURL, strings.NewReader("{}"))
	req.Header.Set("X-Secret", "s3cret")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 429 || len(rec.all()) != 0 {
		t.Fatalf("good sender after the flood: %d, handler saw %d", resp.StatusCode, len(rec.all()))
	}
}

// floodRefused sends n requests without the required header from a few
// keep-alive connections and checks each is refused.
func floodRefused(t *testing.T, url string, n int) {
	t.Helper()
	const workers = 4
	var wg sync.WaitGroup
	errs := make(chan string, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < n; i += workers {
				resp, err := http.Post(url, "application/json", strings.NewReader("{}"))
				if err != nil {
					errs <- err.Error()
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 401 {
					errs <- resp.Status
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatalf("a sender without the header got %s, want 401", e)
	}
}

func TestRefusalNoticesAreCoalesced(t *testing.T) {
	const interval = 300 * time.Millisecond
	st := inspectortest.Start(t, inspectortest.Options{ForwardTo: "http://127.0.0.1:1", NoAgent: true,
		Relay: func(c *relay.Config) {
			c.RateLimit, c.RateBurst = 1e6, 1e6
			c.NoticeInterval = interval
		}})
	d := websocket.Dialer{Subprotocols: []string{relay.Subprotocol}}
	hdr := http.Header{"Authorization": {"Bearer " + st.Token}, relay.RequireHeaderHeader: {"X-Secret: s3cret"}}
	ws, resp, err := d.Dial(strings.Replace(st.RelayURL, "http", "ws", 1)+relay.ConnectPath, hdr)
	if err != nil {
		t.Fatalf("dial: %v (%v)", err, resp)
	}
	defer ws.Close()
	if _, b, err := ws.ReadMessage(); err != nil || b[0] != 0x01 {
		t.Fatalf("no hello: %v", err)
	}

	const n = 400
	start := time.Now()
	floodRefused(t, st.TunnelURL, n)
	// Every refusal is counted in the end, in a handful of notices.
	notices := 0
	ws.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		_, b, err := ws.ReadMessage()
		if err != nil {
			t.Fatalf("the agent was not told of all %d refusals (%d notices): %v", n, notices, err)
		}
		if b[0] != 0x05 {
			continue
		}
		notices++
		var nt relay.Notice
		if err := json.Unmarshal(b[1:], &nt); err != nil {
			t.Fatal(err)
		}
		if nt.Rejected == n {
			break
		}
	}
	// At most one notice per interval, the first at once.
	if most := int(time.Since(start)/interval) + 1; notices > most {
		t.Errorf("%d refusals sent %d notices to the agent, want at most %d (one per %s)", n, notices, most, interval)
	}
}
