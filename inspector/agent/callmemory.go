package agent

import (
	"context"
	"log/slog"
	"sync"

	"github.com/calltap/calltap/inspector/routes"
	"github.com/calltap/calltap/storage/agentdb"
)

// CallMemory is what each call's events carried at a route file's match
// paths (routes.CallValues), so that a call's later events, which lack a
// field its earlier ones had, follow them. It holds what this run saw;
// what it has not seen of a call it reads once from the store, so that a
// call stays together across a restart: the captures of the call's
// earlier events are kept there.
//
// It is bounded: past maxCalls calls it forgets the older half, which the
// store still has.
type CallMemory struct {
	store *agentdb.AgentStore // read-only
	log   *slog.Logger        // read-only

	mu  sync.Mutex           // guards the maps; taken alone, never across a read of the store
	cur map[string]*callVals // guarded by mu: the calls seen lately
	old map[string]*callVals // guarded by mu: the generation before, moved to cur when seen again
}

// callVals is one call's values by dot path, and the paths already looked
// up in the store.
type callVals struct {
	vals   map[string]string
	looked map[string]bool
}

// maxCalls is how many calls a generation of the memory holds.
const maxCalls = 1 << 15

// callBodies is how many of a call's earlier captures a look-up reads: a
// call has six events, and their retries.
const callBodies = 64

// NewCallMemory returns an empty memory backed by store.
func NewCallMemory(store *agentdb.AgentStore, log *slog.Logger) *CallMemory {
	if log == nil {
		log = slog.Default()
	}
	return &CallMemory{store: store, log: log, cur: map[string]*callVals{}, old: map[string]*callVals{}}
}

var _ routes.CallValues = (*CallMemory)(nil)

// Get is the value the call's events had at dotPath: from this run's, or
// else read from the captures of its earlier events.
func (m *CallMemory) Get(callID, dotPath string) (string, bool) {
	m.mu.Lock()
	cv := m.entry(callID)
	v, ok := cv.vals[dotPath]
	looked := cv.looked[dotPath]
	m.mu.Unlock()
	if ok || looked {
		return v, ok
	}
	v, ok = m.lookUp(callID, dotPath)
	m.mu.Lock()
	defer m.mu.Unlock()
	cv = m.entry(callID)
	cv.looked[dotPath] = true
	if old, had := cv.vals[dotPath]; had {
		return old, true // an event remembered it meanwhile
	}
	if ok {
		cv.vals[dotPath] = v
	}
	return v, ok
}

// Remember records the value an event of the call has at dotPath.
func (m *CallMemory) Remember(callID, dotPath, value string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.entry(callID).vals[dotPath] = value
}

// entry is the call's values, made when new. Called with mu held.
func (m *CallMemory) entry(callID string) *callVals {
	if cv := m.cur[callID]; cv != nil {
		return cv
	}
	cv := m.old[callID]
	if cv != nil {
		delete(m.old, callID)
	} else {
		cv = &callVals{vals: map[string]string{}, looked: map[string]bool{}}
	}
	if len(m.cur) >= maxCalls {
		m.old, m.cur = m.cur, make(map[string]*callVals, maxCalls)
	}
	m.cur[callID] = cv
	return cv
}

// lookUp reads the value the call's saved events had at dotPath: the last
// one's that has it.
func (m *CallMemory) lookUp(callID, dotPath string) (string, bool) {
	bodies, err := m.store.CallBodies(context.Background(), callID, callBodies)
	if err != nil {
		m.log.Warn("reading a call's earlier events for its route; routed on this event alone", "call_id", callID, "err", err)
		return "", false
	}
	var val string
	var found bool
	for _, b := range bodies {
		if v, ok := routes.ValueAt(b, dotPath); ok {
			val, found = v, true
		}
	}
	return val, found
}
