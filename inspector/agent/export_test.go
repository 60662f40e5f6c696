package agent

import (
	"context"

	"github.com/calltap/calltap/storage/agentdb"
)

// WriteCapturesFunc commits captures in a test's way: it may fail a
// commit the way a full disk does.
type WriteCapturesFunc func(ctx context.Context, inserts, updates []*agentdb.Capture) ([]agentdb.Written, error)

// LogCaptures calls f.
func (f WriteCapturesFunc) LogCaptures(ctx context.Context, inserts, updates []*agentdb.Capture) ([]agentdb.Written, error) {
	return f(ctx, inserts, updates)
}

// NewWritingThrough is New, the agent committing its captures through f
// instead of cfg.Store (for stackOptions.NewAgent).
func NewWritingThrough(cfg Config, f WriteCapturesFunc) (*Agent, error) {
	a, err := New(cfg)
	if err != nil {
		return nil, err
	}
	a.cm.captures = f
	return a, nil
}

// ReadCaptureFunc reads a capture back in a test's way: it may fail the
// read the way a store that cannot apply its intake log does.
type ReadCaptureFunc func(ctx context.Context, id string) (*agentdb.Capture, error)

// Capture calls f.
func (f ReadCaptureFunc) Capture(ctx context.Context, id string) (*agentdb.Capture, error) {
	return f(ctx, id)
}

// NewLoadingThrough is New, the agent reading saved requests back for
// their turn through f instead of cfg.Store.
func NewLoadingThrough(cfg Config, f ReadCaptureFunc) (*Agent, error) {
	a, err := New(cfg)
	if err != nil {
		return nil, err
	}
	a.loader = f
	return a, nil
}

// LiveRequests is how many live requests served alone or alongside a are
// still answering (committer.live): none once every answer is in.
func LiveRequests(a *Agent) int64 { return a.cm.live.Load() }

// WaitingTurns is how many of a's requests are in the turn line or at the
// handler in their turn (every lane's waiting): none once the line has run.
func WaitingTurns(a *Agent) int64 {
	a.lanesMu.Lock()
	defer a.lanesMu.Unlock()
	var n int64
	for _, l := range a.lanes {
		n += l.waiting.Load()
	}
	return n
}
