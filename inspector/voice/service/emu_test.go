package service

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/calltap/calltap/inspector/voice/emulator"
	"github.com/calltap/calltap/inspector/voice/emulator/emulatortest"
)

// Keys every test emulator accepts.
const (
	rwKey = emulatortest.Key     // webhooks:read, webhooks:write
	roKey = emulatortest.ReadKey // webhooks:read
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

// startEmu starts the emulator with emulatortest's defaults, edit applied,
// serving through e.wrap when a test sets one.
func startEmu(t *testing.T, edit func(*emulator.Config)) *emu {
	t.Helper()
	e := &emu{t: t}
	started := emulatortest.Start(t, edit, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			e.mu.Lock()
			wrap := e.wrap
			e.mu.Unlock()
			if wrap != nil {
				wrap(w, r, next)
				return
			}
			next.ServeHTTP(w, r)
		})
	})
	e.srv, e.url, e.base = started.Server, started.URL, started.Base
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
