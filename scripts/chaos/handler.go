package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/calltap/calltap/scripts/chaos/history"
)

// handler is the developer's webhook handler at the end of the tunnel: it
// answers every request 200 at once, with a body naming the delivery id
// and a counter of the copy (so that a sender's 2xx can be matched to the
// copy it came from), and records each request in handler.jsonl in the
// order it received them.
type handler struct {
	log    *history.Log[history.Copy]
	calls  *registry
	tunnel string
	srv    *http.Server
	url    string

	mu     sync.Mutex     // held while a copy is stamped, counted and appended, so the file's order is the order of arrival
	copies int            // guarded by mu
	seen   map[string]int // guarded by mu; copies per delivery id
	last   time.Time      // guarded by mu; when the last copy arrived
}

func startHandler(log *history.Log[history.Copy], calls *registry, tunnel string) (*handler, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	h := &handler{log: log, calls: calls, tunnel: tunnel, seen: map[string]int{}, url: "http://" + ln.Addr().String() + "/hook"}
	h.srv = &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go h.srv.Serve(ln)
	return h, nil
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		// A request cut mid-body never reached the handler's logic.
		return
	}
	var p struct {
		ID   string `json:"id"`
		Call struct {
			CallID string `json:"call_id"`
		} `json:"call"`
	}
	json.Unmarshal(body, &p)
	sum := sha256.Sum256(body)
	seq := -1
	if d, ok := h.calls.get(p.ID); ok {
		seq = d.seq
	}

	h.mu.Lock()
	h.copies++
	h.seen[p.ID]++
	h.last = time.Now()
	answer := fmt.Sprintf(`{"delivery_id":%q,"copy":%d}`, p.ID, h.copies)
	c := history.Copy{ReceivedAt: h.last.UnixNano(), Tunnel: h.tunnel, DeliveryID: p.ID, CallID: p.Call.CallID, Seq: seq,
		BodySHA256: hex.EncodeToString(sum[:]), Status: http.StatusOK, AnswerBody: answer}
	if err := h.log.Append(c); err != nil {
		slog.Error("handler: cannot record a copy", "err", err)
	}
	h.mu.Unlock()

	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	io.WriteString(w, answer)
}

// count is how many copies of id the handler has received.
func (h *handler) count(id string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.seen[id]
}

// lastCopy is when the last copy arrived (zero before the first).
func (h *handler) lastCopy() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.last
}

func (h *handler) close() { h.srv.Close() }
