package service

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/calltap/calltap/inspector/voice/emulator"
)

// Keys every test emulator accepts.
const (
	rwKey = "test_key" // webhooks:read, webhooks:write
	roKey = "ro_key"   // webhooks:read
)

// emu is the real emulator on a loopback socket, with an optional wrapper
// in front of its API (to count requests or answer 429).
type emu struct {
	t    *testing.T
	srv  *emulator.Server
	url  string // http://127.0.0.1:port
	base string // url + /api/v1/ext/

	mu   sync.Mutex
	wrap func(w http.ResponseWriter, r *http.Request, next http.Handler) // guarded by mu
}

func startEmu(t *testing.T, edit func(*emulator.Config)) *emu {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := emulator.Config{
		Keys: []emulator.Key{
			{Key: rwKey, Scopes: []string{emulator.ScopeWebhooksRead, emulator.ScopeWebhooksWrite}},
			{Key: roKey, Scopes: []string{emulator.ScopeWebhooksRead}},
		},
		DataDir:           t.TempDir(),
		TimeScale:         0.001,
		AllowHTTPWebhooks: true,
		DeliveryTimeout:   5 * time.Second,
		PublicURL:         "http://" + ln.Addr().String(),
	}
	if edit != nil {
		edit(&cfg)
	}
	srv, err := emulator.New(cfg)
	if err != nil {
		ln.Close()
		t.Fatal(err)
	}
	e := &emu{t: t, srv: srv, url: cfg.PublicURL, base: cfg.PublicURL + emulator.Prefix + "/"}
	hs := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		wrap := e.wrap
		e.mu.Unlock()
		if wrap != nil {
			wrap(w, r, srv.Handler())
			return
		}
		srv.Handler().ServeHTTP(w, r)
	})}
	go hs.Serve(ln)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-ran
		hs.Close()
		srv.Close()
	})
	return e
}

func (e *emu) setWrap(w func(http.ResponseWriter, *http.Request, http.Handler)) {
	e.mu.Lock()
	e.wrap = w
	e.mu.Unlock()
}

func (e *emu) client(key string) *Client {
	e.t.Helper()
	c, err := New(e.base, key)
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// dispatch starts a call on the emulator and returns its id.
func (e *emu) dispatch(body map[string]any) string {
	e.t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest("POST", e.base+"calls/dispatch/", bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+rwKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var env struct {
		Data struct {
			CallID string `json:"call_id"`
		} `json:"data"`
	}
	if resp.StatusCode != 201 || json.Unmarshal(raw, &env) != nil || env.Data.CallID == "" {
		e.t.Fatalf("dispatch: %d %s", resp.StatusCode, raw)
	}
	return env.Data.CallID
}

// received is a request a target got.
type received struct {
	body []byte
	id   string
}

// target is a webhook handler on a loopback socket that answers 200 and
// keeps every request.
type target struct {
	*httptest.Server
	mu  sync.Mutex
	got []received // guarded by mu
}

func newTarget(t *testing.T) *target {
	tg := &target{}
	tg.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var p struct {
			ID string `json:"id"`
		}
		json.Unmarshal(body, &p)
		tg.mu.Lock()
		tg.got = append(tg.got, received{body: body, id: p.ID})
		tg.mu.Unlock()
		w.WriteHeader(200)
	}))
	t.Cleanup(tg.Close)
	return tg
}

func (tg *target) requests() []received {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	return append([]received(nil), tg.got...)
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
