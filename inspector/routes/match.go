package routes

import (
	"net/http"
	"path"
	"sync"
)

// Memory is a CallValues in memory.
type Memory struct {
	mu   sync.Mutex
	vals map[[2]string]string // {call id, dot path} -> value; guarded by mu
}

// NewMemory returns an empty Memory.
func NewMemory() *Memory { return &Memory{vals: map[[2]string]string{}} }

func (m *Memory) Get(callID, dotPath string) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.vals[[2]string{callID, dotPath}]
	return v, ok
}

func (m *Memory) Remember(callID, dotPath, value string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.vals[[2]string{callID, dotPath}] = value
}

// value is a match path's value for one request: from its body, or
// remembered from its call.
type value struct {
	field
	recalled string
	isRecall bool
}

func (v value) present() bool { return v.isRecall || v.field.present() }

func (v value) equal(want string) bool {
	if v.isRecall {
		return v.recalled == want
	}
	return v.field.equal(want)
}

// maxStackFields is how many body fields Match reads without allocating.
const maxStackFields = 16

// Match decides where req goes: the first route that takes it, or none
// (the default), or, with an event filter, stored only.
func (t *Table) Match(req Request) Decision {
	var buf [maxStackFields]value
	var vals []value
	if len(t.paths) <= maxStackFields {
		vals = buf[:len(t.paths)]
	} else {
		vals = make([]value, len(t.paths))
	}
	t.read(req.Body, vals)
	d := Decision{Event: req.Event}
	if d.Event == "" && vals[0].str {
		d.Event = vals[0].text()
	}
	if vals[1].str {
		d.CallID = vals[1].text()
	}
	if t.events != nil && !anyGlob(t.events, d.Event) {
		d.Filtered = true
		return d
	}
	t.stick(d.CallID, vals)
	for _, r := range t.routes {
		if r.takes(d.Event, req, vals) {
			d.Route = r
			break
		}
	}
	return d
}

// read fills vals from one pass over body. The scanner's recursion makes
// its fields escape, so they come from a pool, not the stack.
func (t *Table) read(body []byte, vals []value) {
	fp, _ := t.scratch.Get().(*[]field)
	if fp == nil || len(*fp) != len(vals) {
		fs := make([]field, len(vals))
		fp = &fs
	}
	fields := *fp
	clear(fields)
	scan(body, t.fields, fields)
	for i := range vals {
		vals[i].field = fields[i]
	}
	clear(fields) // holds no body once back in the pool
	t.scratch.Put(fp)
}

// stick keeps a call together: it remembers the match paths' values the
// event has, and recalls those it lacks. It asks its CallValues only for
// what is missing, which may be a read of the store (a call whose earlier
// events came before a restart).
func (t *Table) stick(callID string, vals []value) {
	if t.calls == nil || callID == "" {
		return
	}
	for slot := 2; slot < len(vals); slot++ {
		v := &vals[slot]
		if v.field.present() {
			t.calls.Remember(callID, t.paths[slot], v.field.text())
		} else if old, had := t.calls.Get(callID, t.paths[slot]); had {
			v.recalled, v.isRecall = old, true
		}
	}
}

// takes reports whether every criterion the route gives holds for req.
func (r *Route) takes(event string, req Request, vals []value) bool {
	if len(r.events) > 0 && !anyGlob(r.events, event) {
		return false
	}
	if r.path != "" {
		if ok, _ := path.Match(r.path, req.Path); !ok {
			return false
		}
	}
	for _, m := range r.match {
		v := vals[m.slot]
		if !v.present() || (m.want != "*" && !v.equal(m.want)) {
			return false
		}
	}
	for _, h := range r.header {
		if !headerHas(req.Header, h) {
			return false
		}
	}
	return true
}

func headerHas(h http.Header, e headerEntry) bool {
	vs := h[e.name]
	if e.want == "*" {
		return len(vs) > 0
	}
	for _, v := range vs {
		if v == e.want {
			return true
		}
	}
	return false
}

// anyGlob reports whether kind matches one of globs; an empty kind (a body
// with no event) matches none.
func anyGlob(globs []string, kind string) bool {
	if kind == "" {
		return false
	}
	for _, g := range globs {
		if ok, _ := path.Match(g, kind); ok {
			return true
		}
	}
	return false
}

// ValueAt is body's value at dotPath as a match compares it (a string's
// text, another value's JSON); false when it is absent or null.
func ValueAt(body []byte, dotPath string) (string, bool) {
	t := newTrie()
	t.add(dotPath, 0)
	fields := make([]field, 1)
	scan(body, t, fields)
	if !fields[0].present() {
		return "", false
	}
	return fields[0].text(), true
}

// Route is the table's route named name; nil when it has none.
func (t *Table) Route(name string) *Route {
	for _, r := range t.routes {
		if r.Name == name {
			return r
		}
	}
	return nil
}

// UsesHeaders reports whether a route reads headers: a caller that must
// convert them for Request.Header need not when none does.
func (t *Table) UsesHeaders() bool { return t.usesHeaders }

// Names are the table's route names, in file order.
func (t *Table) Names() []string {
	names := make([]string, len(t.routes))
	for i, r := range t.routes {
		names[i] = r.Name
	}
	return names
}
