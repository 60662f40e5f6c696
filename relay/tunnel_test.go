package relay_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/calltap/calltap/cmd/stacktest"
	"github.com/calltap/calltap/relay"
	"github.com/calltap/calltap/relay/polltest"
	"github.com/calltap/calltap/relay/tunnel"
	"github.com/calltap/calltap/relay/wire"
)

// seen is what the local handler received.
type seen struct {
	Method string
	Path   string
	Query  string
	Header http.Header
	Body   []byte
}

// recorder is a local handler that records requests and answers with fn.
type recorder struct {
	mu   sync.Mutex
	reqs []seen
	fn   func(w http.ResponseWriter, r *http.Request)
}

func (h *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	h.mu.Lock()
	h.reqs = append(h.reqs, seen{r.Method, r.URL.EscapedPath(), r.URL.RawQuery, r.Header.Clone(), body})
	h.mu.Unlock()
	if h.fn != nil {
		h.fn(w, r)
		return
	}
	w.Header().Add("X-Reply", "one")
	w.Header().Add("X-Reply", "two")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, "got %d bytes", len(body))
}

func (h *recorder) all() []seen {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]seen(nil), h.reqs...)
}

func startHandler(t *testing.T, fn func(http.ResponseWriter, *http.Request)) (*recorder, *httptest.Server) {
	rec := &recorder{fn: fn}
	srv := httptest.NewServer(rec)
	t.Cleanup(srv.Close)
	return rec, srv
}

func TestTunnelCarriesRequestByteExact(t *testing.T) {
	rec, h := startHandler(t, nil)
	st := stacktest.Start(t, stacktest.Options{ForwardTo: h.URL + "/webhooks"})

	body := make([]byte, 4096)
	rand.Read(body)
	req, _ := http.NewRequest("PUT", st.TunnelURL+"/calls/ev%2Fents%20x?b=2&a=1&a=3", bytes.NewReader(body))
	req.Header.Add("X-Multi", "first")
	req.Header.Add("X-Multi", "second")
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("status %d, want 201: %s", resp.StatusCode, got)
	}
	if string(got) != "got 4096 bytes" {
		t.Errorf("body %q", got)
	}
	if v := resp.Header.Values("X-Reply"); len(v) != 2 || v[0] != "one" || v[1] != "two" {
		t.Errorf("response header X-Reply = %q, want [one two]", v)
	}
	reqs := rec.all()
	if len(reqs) != 1 {
		t.Fatalf("handler saw %d requests", len(reqs))
	}
	r := reqs[0]
	if r.Method != "PUT" || r.Path != "/webhooks/calls/ev%2Fents%20x" || r.Query != "b=2&a=1&a=3" {
		t.Errorf("handler saw %s %s?%s", r.Method, r.Path, r.Query)
	}
	if v := r.Header.Values("X-Multi"); len(v) != 2 || v[0] != "first" || v[1] != "second" {
		t.Errorf("X-Multi = %q", v)
	}
	if !bytes.Equal(r.Body, body) {
		t.Error("body changed on the way")
	}

	// And it was saved byte-exact before being forwarded.
	var page struct {
		Data struct {
			Count   int `json:"count"`
			Results []struct {
				ID string `json:"id"`
			} `json:"results"`
		} `json:"data"`
	}
	getJSON(t, st.InspectorURL+"/api/v1/ext/webhooks/", &page)
	if page.Data.Count != 1 {
		t.Fatalf("count %d", page.Data.Count)
	}
	c, err := st.AgentDB.Capture(context.Background(), page.Data.Results[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(c.Body, body) || c.ResponseStatus != 201 {
		t.Errorf("stored body equal=%v status=%d", bytes.Equal(c.Body, body), c.ResponseStatus)
	}
}

func getJSON(t *testing.T, url string, v any) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode
}

func post(t *testing.T, url, body string) (*http.Response, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

func TestTunnelManyInFlight(t *testing.T) {
	var inside atomic.Int32
	var peak atomic.Int32
	release := make(chan struct{})
	rec, h := startHandler(t, func(w http.ResponseWriter, r *http.Request) {
		n := inside.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		<-release
		inside.Add(-1)
		io.WriteString(w, r.URL.Query().Get("i"))
	})
	st := stacktest.Start(t, stacktest.Options{ForwardTo: h.URL})
	const n = 50
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			resp, err := http.Post(fmt.Sprintf("%s/?i=%d", st.TunnelURL, i), "text/plain", strings.NewReader("x"))
			if err != nil {
				errs <- err
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || string(b) != fmt.Sprint(i) {
				errs <- fmt.Errorf("request %d: %d %q", i, resp.StatusCode, b)
			}
		}(i)
	}
	// All 50 are inside the handler at once: one connection carries them concurrently.
	polltest.Until(t, 10*time.Second, func() bool { return inside.Load() == n }, "requests were not in flight together")
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if len(rec.all()) != n {
		t.Errorf("handler saw %d", len(rec.all()))
	}
}

func TestTunnelTenMiBBody(t *testing.T) {
	rec, h := startHandler(t, nil)
	st := stacktest.Start(t, stacktest.Options{ForwardTo: h.URL})
	body := make([]byte, 10<<20)
	rand.Read(body)
	resp, err := http.Post(st.TunnelURL+"/big", "application/octet-stream", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if r := rec.all(); len(r) != 1 || !bytes.Equal(r[0].Body, body) {
		t.Fatal("10 MiB body did not arrive intact")
	}
	// One byte more than the limit is refused.
	resp, err = http.Post(st.TunnelURL+"/big", "application/octet-stream", bytes.NewReader(append(body, 0)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("over the limit: status %d, want 413", resp.StatusCode)
	}
}

func errorCode(t *testing.T, body string) string {
	t.Helper()
	var env struct {
		Status bool `json:"status"`
		Error  struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &env); err != nil || env.Status || env.Error.Code == "" {
		t.Fatalf("not an error envelope: %s", body)
	}
	return env.Error.Code
}

func TestTunnelErrors(t *testing.T) {
	slow := make(chan struct{})
	_, h := startHandler(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			select {
			case <-slow:
			case <-r.Context().Done():
			}
		}
	})
	st := stacktest.Start(t, stacktest.Options{ForwardTo: h.URL, Relay: func(c *relay.Config) { c.ForwardTimeout = 300 * time.Millisecond }})

	resp, body := post(t, st.RelayURL+"/t/0123456789abcdef0123456789abcdef/x", "{}")
	if resp.StatusCode != 404 || errorCode(t, body) != "not_found" {
		t.Errorf("unknown tunnel: %d %s", resp.StatusCode, body)
	}
	resp, body = post(t, st.TunnelURL+"/slow", "{}")
	if resp.StatusCode != 504 || errorCode(t, body) != "gateway_timeout" {
		t.Errorf("slow handler: %d %s", resp.StatusCode, body)
	}
	close(slow)
	h.Close() // the local handler goes away
	resp, body = post(t, st.TunnelURL+"/x", "{}")
	if resp.StatusCode != 502 || errorCode(t, body) != "bad_gateway" {
		t.Errorf("handler down: %d %s", resp.StatusCode, body)
	}
}

func TestWrongTokenIsRefusedAndClientStops(t *testing.T) {
	_, h := startHandler(t, nil)
	st := stacktest.Start(t, stacktest.Options{ForwardTo: h.URL})
	c, err := tunnel.NewClient(tunnel.Config{RelayURL: st.RelayURL, Token: "ct_wrong", Handler: nopHandler{}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = c.Run(ctx)
	if !errors.Is(err, tunnel.ErrUnauthorized) {
		t.Fatalf("Run = %v, want ErrUnauthorized", err)
	}
	// The handshake itself answers 401 in the envelope.
	req, _ := http.NewRequest("GET", st.RelayURL+wire.ConnectPath, nil)
	req.Header.Set("Authorization", "Bearer ct_wrong")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 401 || errorCode(t, string(b)) != "unauthorized" {
		t.Errorf("handshake with a wrong token: %d %s", resp.StatusCode, b)
	}
}

type nopHandler struct{}

func (nopHandler) ServeTunnel(r *wire.Request, s *tunnel.Stream) { s.Release() }

func TestRelayRestartKeepsURL(t *testing.T) {
	rec, h := startHandler(t, nil)
	st := stacktest.Start(t, stacktest.Options{ForwardTo: h.URL})
	if resp, body := post(t, st.TunnelURL+"/before", "{}"); resp.StatusCode != 201 {
		t.Fatalf("before restart: %d %s", resp.StatusCode, body)
	}
	st.StopRelay()
	polltest.Until(t, 10*time.Second, func() bool { return st.Agent.TunnelState().State != tunnel.StateConnected }, "agent did not notice the relay going away")
	st.StartRelay()
	st.WaitConnected()
	if resp, body := post(t, st.TunnelURL+"/after", "{}"); resp.StatusCode != 201 {
		t.Fatalf("after restart: %d %s", resp.StatusCode, body)
	}
	if n := len(rec.all()); n != 2 {
		t.Errorf("handler saw %d requests", n)
	}
}
