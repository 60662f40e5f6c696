// The relay's queued copies of live requests this agent saved already.
//
// A relay that takes an agent for frozen (no pong for 3 s: a laptop's lid
// closed, a slow link) queues copies of the live requests in flight to it,
// with their relay ids, and answers their senders 202. When the agent
// answers on the same connection, the relay drops the copies of what it
// answered; when the agent comes back on a new connection (its own
// keepalive ran out meanwhile), the copies come as queued requests. The
// store knows a queued request sent twice, not a queued copy of a live
// one: without this set the copy would be saved as a repeat and handed to
// the handler a second time.

package agent

import "sync"

// liveGeneration bounds each generation of liveSaved: far more than a
// relay sends live in the seconds a freeze lasts.
const liveGeneration = 4096

// liveSaved is the relay ids of the live requests whose captures were
// committed lately: two generations, the older dropped when the newer is
// full.
type liveSaved struct {
	mu  sync.Mutex
	cur map[string]struct{} // guarded by mu
	old map[string]struct{} // guarded by mu
}

// add notes relay id r, whose live capture is committed.
func (l *liveSaved) add(r string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.cur) >= liveGeneration || l.cur == nil {
		l.old, l.cur = l.cur, make(map[string]struct{}, liveGeneration)
	}
	l.cur[r] = struct{}{}
}

// has reports whether relay id r is a live capture committed lately.
func (l *liveSaved) has(r string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, inCur := l.cur[r]
	_, inOld := l.old[r]
	return inCur || inOld
}
