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

// handler is the developers' webhook handlers at the ends of the tunnel:
// a server per route of the default agent's route file and one for its
// default (--forward-to), and one for each claimant's agent, each
// answering every request 200 at once, with a body naming the server, the
// delivery id and a counter of the copy across all servers (so that a
// sender's 2xx can be matched to the copy it came from). All record each
// request in one handler.jsonl, in the order they received them, each copy
// naming the agent and route whose server got it.
type handler struct {
	log    *history.Log[history.Copy]
	calls  *registry
	tunnel string
	srvs   []*http.Server
	urls   map[server]string // each server's URL; set before the servers serve

	mu     sync.Mutex     // held while a copy is stamped, counted and appended, so the file's order is the order of arrival
	copies int            // guarded by mu
	seen   map[string]int // guarded by mu; copies per delivery id, at any server
	last   time.Time      // guarded by mu; when the last copy arrived
}

// server names one handler server: the agent whose forwards it gets (a
// claimant's name, "" for the default agent) and the route it stands for.
type server struct{ seat, route string }

// startHandler starts a server for each of srvs.
func startHandler(log *history.Log[history.Copy], calls *registry, tunnel string, srvs []server) (*handler, error) {
	h := &handler{log: log, calls: calls, tunnel: tunnel, seen: map[string]int{}, urls: map[server]string{}}
	lns := make([]net.Listener, 0, len(srvs))
	for _, sv := range srvs {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			for _, ln := range lns {
				ln.Close()
			}
			return nil, err
		}
		lns = append(lns, ln)
		h.urls[sv] = "http://" + ln.Addr().String() + "/hook"
		h.srvs = append(h.srvs, &http.Server{ReadHeaderTimeout: 10 * time.Second,
			Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h.serve(sv, w, r) })})
	}
	for i, srv := range h.srvs {
		go srv.Serve(lns[i])
	}
	return h, nil
}

// serve answers and records one request that reached server sv.
func (h *handler) serve(sv server, w http.ResponseWriter, r *http.Request) {
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
	answer := fmt.Sprintf(`{"seat":%q,"route":%q,"delivery_id":%q,"copy":%d}`, sv.seat, sv.route, p.ID, h.copies)
	c := history.Copy{ReceivedAt: h.last.UnixNano(), Tunnel: h.tunnel, DeliveryID: p.ID, CallID: p.Call.CallID, Seq: seq,
		Route: sv.route, Seat: sv.seat, BodySHA256: hex.EncodeToString(sum[:]), Status: http.StatusOK, AnswerBody: answer}
	if err := h.log.Append(c); err != nil {
		slog.Error("handler: cannot record a copy", "err", err)
	}
	h.mu.Unlock()

	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	io.WriteString(w, answer)
}

// count is how many copies of id the handler's servers have received.
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

func (h *handler) close() {
	for _, srv := range h.srvs {
		srv.Close()
	}
}
