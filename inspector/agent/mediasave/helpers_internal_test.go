package mediasave

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/calltap/calltap/storage/agentdb"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// openStore opens an agent store of the test's own, for the saver's
// records and the captures they refer to.
func openStore(t *testing.T) *agentdb.AgentStore {
	t.Helper()
	path := filepath.Join(t.TempDir(), "agent.db")
	db, err := agentdb.OpenAgent(context.Background(), path)
	if err != nil {
		t.Fatalf("opening %s: %v", path, err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// testCapture is a pending capture of a POST with body, not yet written.
func testCapture(body string) *agentdb.Capture {
	return &agentdb.Capture{ID: uuid.NewString(), Source: "tunnel", CreatedAt: time.Now().UTC(), Method: "POST", Path: "/hook",
		RequestHeaders: "[]", Body: []byte(body), Status: agentdb.StatusPending, MaxAttempts: 1, Duration: -1}
}

// writeCapture writes c to db: a saver's records refer to a capture.
func writeCapture(t *testing.T, db *agentdb.AgentStore, c *agentdb.Capture) *agentdb.Capture {
	t.Helper()
	if _, err := db.WriteCaptures(context.Background(), []*agentdb.Capture{c}, nil); err != nil {
		t.Fatal(err)
	}
	return c
}

// newSaver makes a saver of cfg, closed when the test ends.
func newSaver(t *testing.T, cfg Config) *Saver {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	return s
}

// warnings is a log handler that keeps the messages logged at Warn and
// above; the saver's goroutines log while the test reads.
type warnings struct {
	mu   sync.Mutex
	msgs []string // guarded by mu
}

func (w *warnings) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, r.Message)
	return nil
}

func (w *warnings) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *warnings) WithGroup(string) slog.Handler      { return w }

func (w *warnings) logged() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.msgs
}
