package agent_test

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// handler is a local handler that answers 200 and keeps what it got.
type handler struct {
	mu     sync.Mutex
	bodies []string // guarded by mu
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	h.mu.Lock()
	h.bodies = append(h.bodies, string(b))
	h.mu.Unlock()
	w.WriteHeader(200)
}

func (h *handler) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.bodies)
}

// send posts body to url and wants 200.
func send(t *testing.T, url, body string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("POST %s: %d", url, resp.StatusCode)
	}
}
