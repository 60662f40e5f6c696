package agent_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/calltap/calltap/inspector/agent"
	"github.com/calltap/calltap/relay/polltest"
)

// slowLog keeps whether the relay (the peer, which logs it as a relay
// does) had the agent's word that a request was saved ("saved") when it
// gave up waiting for the local handler.
type slowLog struct {
	mu    sync.Mutex
	saved []bool // guarded by mu
}

func (l *slowLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *slowLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *slowLog) WithGroup(string) slog.Handler            { return l }

func (l *slowLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "local handler too slow" {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "saved" {
			l.mu.Lock()
			l.saved = append(l.saved, a.Value.Bool())
			l.mu.Unlock()
		}
		return true
	})
	return nil
}

// A live request sent alongside another is acknowledged to the relay once
// committed, when its handler is slow to answer: the relay then knows it
// is saved. One served alone sends no ack (see sendAlone). Once both are
// answered, no live request is counted in flight: the next one may go
// alone again.
func TestSlowAlongsideRequestIsAcknowledged(t *testing.T) {
	g := newGate()
	hs := httptest.NewServer(g)
	defer hs.Close()
	defer g.open() // a failure lets the held requests go: Close waits for them
	rl := &slowLog{}
	st := startStack(t, stackOptions{ForwardTo: hs.URL, ForwardTimeout: 2 * time.Second, // the handler holds both: the relay gives up on them
		PeerLog: slog.New(rl)})
	codes := make(chan int, 2)
	for seq, body := range []string{`{"seq":1,"hold":true}`, `{"seq":2,"hold":true}`} {
		go func() {
			code, _ := post(t, st.TunnelURL+"/hook", body)
			codes <- code
		}()
		g.arrived(t, seq+1) // the first is at the handler, alone, before the second comes
	}
	for range 2 {
		if code := <-codes; code != http.StatusGatewayTimeout {
			t.Errorf("a request the handler holds: %d, want 504", code)
		}
	}
	rl.mu.Lock()
	saved := append([]bool(nil), rl.saved...)
	rl.mu.Unlock()
	if len(saved) != 2 || saved[0] == saved[1] {
		t.Errorf("saved, as the relay had it, of the alone and the alongside request: %v, want one of each", saved)
	}

	g.open()
	polltest.Until(t, 10*time.Second, func() bool { return agent.LiveRequests(st.Agent) == 0 },
		"live requests still counted once all are answered")
}

// warnings keeps the messages an agent logs at Warn and above.
type warnings struct {
	mu   sync.Mutex
	msgs []string // guarded by mu
}

func (w *warnings) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w *warnings) WithAttrs([]slog.Attr) slog.Handler           { return w }
func (w *warnings) WithGroup(string) slog.Handler                { return w }

func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	w.mu.Lock()
	w.msgs = append(w.msgs, r.Message)
	w.mu.Unlock()
	return nil
}

// A live request with a large body has it written to its file on a
// goroutine of its own beside the commit: it reaches the handler, is
// stored whole, and nothing is said to be wrong.
func TestLargeLiveBodyIsStagedQuietly(t *testing.T) {
	h := &handler{}
	hs := httptest.NewServer(h)
	defer hs.Close()
	warned := &warnings{}
	st := startStack(t, stackOptions{ForwardTo: hs.URL, Logger: slog.New(warned)})
	body := `{"big":"` + strings.Repeat("x", 1<<20) + `"}`
	send(t, st.TunnelURL+"/hook", body)
	if err := st.Agent.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if c := captureOf(t, st, body); c.ResponseStatus != 200 {
		t.Errorf("the large request's capture: answer %d", c.ResponseStatus)
	}
	warned.mu.Lock()
	defer warned.mu.Unlock()
	if len(warned.msgs) != 0 || h.count() != 1 {
		t.Errorf("handler got %d requests; warnings %q", h.count(), warned.msgs)
	}
}
