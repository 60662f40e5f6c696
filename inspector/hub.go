package inspector

import (
	"encoding/json"
	"sync"
	"sync/atomic"
)

// hub fans live events out to the inspector's SSE subscribers. publish
// never blocks: a subscriber that cannot keep up loses events and is told
// to reload (the "resync" event) instead of slowing the capture path.
type hub struct {
	mu   sync.Mutex
	subs map[*subscriber]struct{} // guarded by mu
	n    atomic.Int32             // len(subs), read without mu
}

type subscriber struct {
	ch      chan sseEvent // buffered; written by publish only
	dropped bool          // guarded by hub.mu
}

type sseEvent struct {
	name string
	data []byte
}

func newHub() *hub { return &hub{subs: map[*subscriber]struct{}{}} }

func (h *hub) subscribe() *subscriber {
	s := &subscriber{ch: make(chan sseEvent, 256)}
	h.mu.Lock()
	h.subs[s] = struct{}{}
	h.n.Store(int32(len(h.subs)))
	h.mu.Unlock()
	return s
}

func (h *hub) unsubscribe(s *subscriber) {
	h.mu.Lock()
	delete(h.subs, s)
	h.n.Store(int32(len(h.subs)))
	h.mu.Unlock()
}

// active reports whether anyone is subscribed, so that an event nobody
// would see need not be rendered.
func (h *hub) active() bool { return h.n.Load() > 0 }

func (h *hub) publish(name string, v any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.subs) == 0 {
		return
	}
	data, err := json.Marshal(v)
	if err != nil {
		return
	}
	ev := sseEvent{name: name, data: data}
	for s := range h.subs {
		if s.dropped {
			continue
		}
		select {
		case s.ch <- ev:
		default:
			s.dropped = true
			select {
			case s.ch <- sseEvent{name: "resync", data: []byte("{}")}:
			default:
			}
		}
	}
}
