package agent

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/calltap/calltap/relay/api"
	"github.com/calltap/calltap/relay/wire"
	"github.com/calltap/calltap/storage/agentdb"
)

// A relay that lets a dot segment through (an older one, say) must still
// not lead the agent out of the --forward-to base path.
func TestAgentKeepsTargetsUnderItsBasePath(t *testing.T) {
	var hits atomic.Int32
	h := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	defer h.Close()
	base, _ := url.Parse(h.URL + "/wh")
	for _, p := range append(refusedPaths(t), "/../admin", "/..", "/a/./b") {
		if got := joinTarget(base, p, "x=1"); got != "" {
			t.Errorf("joinTarget(%q) = %q, want none", p, got)
		}
	}
	if got, want := joinTarget(base, "/.well-known/a..b", "x=1"), h.URL+"/wh/.well-known/a..b?x=1"; got != want {
		t.Errorf("joinTarget = %q, want %q", got, want)
	}
	// The path is passed on as its sender escaped it, not escaped again.
	if got, want := joinTarget(base, "/a%20b/c%3Bd", ""), h.URL+"/wh/a%20b/c%3Bd"; got != want {
		t.Errorf("joinTarget of an escaped path = %q, want %q", got, want)
	}

	ctx := context.Background()
	db, err := agentdb.OpenAgent(ctx, filepath.Join(t.TempDir(), "agent.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	a, err := New(Config{Store: db, ForwardTo: base.String(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	c := a.newCapture(SourceTunnel, "POST", "/%2e%2e/admin?x=1", nil, []byte("{}"))
	if c.Target != "" || !strings.Contains(c.Error, "outside") {
		t.Fatalf("capture target %q, error %q", c.Target, c.Error)
	}
	res := a.send(ctx, c, nil, wire.Limits{}, nil)
	if res.err != c.Error || hits.Load() != 0 {
		t.Errorf("sent with error %q, handler hit %d times", res.err, hits.Load())
	}
}

// refusedPaths reads the spellings of dot segments the path rule refuses
// (relay/tunnelpath/testdata).
func refusedPaths(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../../relay/tunnelpath/testdata/refused.txt")
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, line := range strings.Split(string(b), "\n") {
		if line != "" && !strings.HasPrefix(line, "#") {
			paths = append(paths, line)
		}
	}
	if len(paths) != 189 {
		t.Fatalf("%d refused paths, want 189", len(paths))
	}
	return paths
}

func TestReplayRefusesDotSegmentPath(t *testing.T) {
	ctx := context.Background()
	db, err := agentdb.OpenAgent(ctx, filepath.Join(t.TempDir(), "agent.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	a, err := New(Config{Store: db, ForwardTo: "http://127.0.0.1:1/wh", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { a.Run(runCtx); close(ran) }()
	defer func() { cancel(); <-ran }()
	orig := a.newCapture(SourceTunnel, "POST", "/calls", nil, []byte("{}"))
	if _, err := db.WriteCaptures(ctx, []*agentdb.Capture{orig}, nil); err != nil {
		t.Fatal(err)
	}
	for _, p := range append(refusedPaths(t), "/../admin", "/%2e%2e/admin?x=1", "/%c0%ae%c0%ae/admin", "/..%00/admin?x=1") {
		_, err := a.prepareReplay(ctx, ReplayOptions{ID: orig.ID, Path: &p})
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest || !strings.Contains(ae.Message, "path") {
			t.Errorf("replay to %s: %v, want 400", p, err)
		}
	}
}
