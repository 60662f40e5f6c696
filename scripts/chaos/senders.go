package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/calltap/calltap/inspector/voice/callevent"
	"github.com/calltap/calltap/scripts/chaos/history"
)

// delivery is one event of a call as the service delivers it.
type delivery struct {
	sender    string
	call      string
	seq       int // the event's position in its call
	event     string
	developer string // the body's call.variables.developer, if it has one
	body      []byte
}

// registry knows every delivery the senders made, by delivery id, so that
// the handler can tell a copy's call position.
type registry struct {
	mu sync.Mutex
	m  map[string]delivery // guarded by mu
}

func (r *registry) add(id string, d delivery) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[string]delivery{}
	}
	r.m[id] = d
}

func (r *registry) get(id string) (delivery, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	d, ok := r.m[id]
	return d, ok
}

// Traffic's shape: calls start every 50-300 ms, at most maxCalls at a
// time, and a burst of 8-20 calls starts at once every 15-40 s, as when a
// campaign starts dialling. A call's events come at the times the service's
// generator gives them, compressed by timeScale, as are the retry delays.
const (
	maxCalls       = 16
	timeScale      = 60
	senderTimeout  = 35 * time.Second // above the relay's --forward-timeout (30 s), so its 504 can arrive
	answerBodyKeep = 4 << 10
)

// senders play the voice service: calls, each a sequence of stamped events,
// every delivery tried on the documented schedule until a 2xx, a status the
// service does not retry, or five attempts.
type senders struct {
	urls   []string // relay nodes' base URLs; attempts take them in turn, as DNS round robin would
	path   string   // the tunnel's path, /t/<tunnel-id>/hook
	tunnel string
	log    *history.Log[history.Send]
	calls  *registry
	mix    mix // whom the calls are for
	client *http.Client
	rng    *rand.Rand // owned by run's goroutine

	next     atomic.Uint64 // round robin over urls
	inflight sync.WaitGroup

	mu       sync.Mutex
	accepted map[string]bool // guarded by mu; deliveries answered 2xx
	active   int             // guarded by mu; calls under way
	started  int             // guarded by mu; calls started
}

func newSenders(urls []string, tunnel string, log *history.Log[history.Send], calls *registry, m mix, seed int64) *senders {
	return &senders{
		urls: urls, path: "/t/" + tunnel + "/hook", tunnel: tunnel, log: log, calls: calls, mix: m,
		client:   &http.Client{Timeout: senderTimeout, Transport: &http.Transport{MaxIdleConnsPerHost: 16, DisableCompression: true}},
		rng:      rand.New(rand.NewPCG(uint64(seed), 0x7ea11c)),
		accepted: map[string]bool{},
	}
}

// run starts calls until stop is closed; the calls under way then finish
// on their own (see wait).
func (s *senders) run(stop <-chan struct{}) {
	nextBurst := time.Now().Add(s.jitter(15*time.Second, 40*time.Second))
	for {
		select {
		case <-stop:
			return
		case <-time.After(s.jitter(50*time.Millisecond, 300*time.Millisecond)):
		}
		if time.Now().After(nextBurst) {
			n := 8 + s.rng.IntN(13)
			slog.Info("senders: a burst of calls", "calls", n)
			for range n {
				s.startCall()
			}
			nextBurst = time.Now().Add(s.jitter(15*time.Second, 40*time.Second))
			continue
		}
		s.mu.Lock()
		busy := s.active >= maxCalls
		s.mu.Unlock()
		if !busy {
			s.startCall()
		}
	}
}

func (s *senders) jitter(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(s.rng.Int64N(int64(hi-lo)))
}

// startCall makes a call's events and sends each at its compressed time.
func (s *senders) startCall() {
	// Media links point nowhere reachable (the agent refuses private
	// addresses), so that a run makes no request off this machine.
	spec := callevent.CallSpec{Start: time.Now(), MediaBaseURL: "http://127.0.0.1:9/media"}
	if s.rng.IntN(5) == 0 {
		spec.Flow = callevent.FlowFailed
		spec.OutcomeCode = callevent.OutcomeCodes[s.rng.IntN(len(callevent.OutcomeCodes))]
	}
	events := s.mix.events(s.rng, spec)
	s.mu.Lock()
	s.active++
	s.started++
	sender := fmt.Sprintf("sender-%d", s.started)
	s.mu.Unlock()
	s.inflight.Add(1)
	go func() {
		defer s.inflight.Done()
		defer func() { s.mu.Lock(); s.active--; s.mu.Unlock() }()
		begin := time.Now()
		var each sync.WaitGroup
		for i, p := range events {
			at, err := callevent.ParseTime(p.OccurredAt)
			if err == nil {
				time.Sleep(time.Until(begin.Add(at.Sub(spec.Start) / timeScale)))
			}
			body, err := json.Marshal(p)
			if err != nil {
				slog.Error("senders: cannot encode an event", "err", err)
				continue
			}
			dev, _ := p.Call.Variables["developer"].(string)
			d := delivery{sender: sender, call: p.Call.CallID, seq: i, event: p.Event, developer: dev, body: body}
			s.calls.add(p.ID, d)
			each.Go(func() { s.deliver(p.ID, d) })
		}
		each.Wait()
	}()
}

// deliver tries one delivery on the service's schedule.
func (s *senders) deliver(id string, d delivery) {
	for attempt := 1; attempt <= callevent.MaxAttempts; attempt++ {
		time.Sleep(callevent.RetrySchedule()[attempt-1] / timeScale)
		status := s.attempt(id, d, attempt)
		if status >= 200 && status < 300 {
			s.mu.Lock()
			s.accepted[id] = true
			s.mu.Unlock()
			return
		}
		if !callevent.Retryable(status) {
			return
		}
	}
}

// attempt sends one HTTP attempt to the next node and records it.
func (s *senders) attempt(id string, d delivery, attempt int) int {
	u := s.urls[int(s.next.Add(1)-1)%len(s.urls)] + s.path
	rec := history.Send{Sender: d.sender, Tunnel: s.tunnel, CallID: d.call, Seq: d.seq, DeliveryID: id, Event: d.event,
		Developer: d.developer, Attempt: attempt}
	rec.SentAt = time.Now().UnixNano()
	resp, err := s.client.Post(u, "application/json", bytes.NewReader(d.body))
	if err == nil {
		var b []byte
		b, err = io.ReadAll(io.LimitReader(resp.Body, answerBodyKeep))
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err == nil {
			rec.Status, rec.Body, rec.RetryAfter = resp.StatusCode, string(b), resp.Header.Get("Retry-After")
		}
	}
	if err != nil {
		rec.Status, rec.Error = 0, err.Error()
	} else {
		rec.AnsweredAt = time.Now().UnixNano()
	}
	if err := s.log.Append(rec); err != nil {
		slog.Error("senders: cannot record an attempt", "err", err)
	}
	return rec.Status
}

// wait waits until every call started has finished its deliveries.
func (s *senders) wait() { s.inflight.Wait() }

// isAccepted reports whether a sender was answered 2xx for id.
func (s *senders) isAccepted(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.accepted[id]
}

// acceptedIDs are the deliveries answered 2xx so far.
func (s *senders) acceptedIDs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]string, 0, len(s.accepted))
	for id := range s.accepted {
		ids = append(ids, id)
	}
	return ids
}
