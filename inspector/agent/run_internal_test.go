package agent

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/calltap/calltap/relay/polltest"
	"github.com/calltap/calltap/storage/agentdb"
	"go.uber.org/goleak"
)

// Run returns only once the work it owns has ended, a replay waiting for
// its next try on the service's schedule among it; afterwards the agent
// refuses work at once instead of waiting for a writer that is gone.
func TestRunWaitsForItsWork(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	var tries atomic.Int32
	h := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tries.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable) // retried, after 5 s on the schedule
	}))
	defer h.Close()
	ctx := context.Background()
	db, err := agentdb.OpenAgent(ctx, filepath.Join(t.TempDir(), "agent.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	a, err := New(Config{Store: db, ForwardTo: h.URL, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { a.Run(runCtx); close(ran) }()
	orig := a.newCapture(SourceTunnel, "POST", "/calls", nil, []byte("{}"))
	if _, err := db.WriteCaptures(ctx, []*agentdb.Capture{orig}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Replay(ctx, ReplayOptions{ID: orig.ID, Retry: "service"}); err != nil {
		t.Fatal(err)
	}
	polltest.Until(t, 10*time.Second, func() bool { return tries.Load() > 0 }, "the replay's first try never came")
	cancel()
	select {
	case <-ran:
	case <-time.After(time.Minute):
		t.Fatal("Run did not return")
	}
	if err := a.Flush(ctx); err != errStopped {
		t.Errorf("Flush after Run: %v, want %v", err, errStopped)
	}
	if _, err := a.Replay(ctx, ReplayOptions{ID: orig.ID, Retry: "service"}); err == nil {
		t.Error("a replay on the schedule was taken after Run returned")
	}
	if n := tries.Load(); n != 1 {
		t.Errorf("%d tries, want 1", n)
	}
}
