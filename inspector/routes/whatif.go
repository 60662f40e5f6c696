package routes

// Tally counts where a route file would send stored captures, and which
// calls would go elsewhere than they went: the what-if of a new route
// file over yesterday's traffic, before it is used.
type Tally struct {
	report Report
	calls  map[string]*CallChange // by call id; what report.ChangedCalls is made of
	order  []string               // call ids, first seen first
}

// Report is a Tally's answer.
type Report struct {
	Captures        int            `json:"captures"`
	Routes          map[string]int `json:"routes"` // route name (or DefaultName, FilteredName) -> captures
	Order           []string       `json:"-"`      // the names of Routes in file order, then DefaultName and FilteredName when counted
	ChangedCaptures int            `json:"changed_captures"`
	ChangedCalls    []CallChange   `json:"changed_calls"` // in the order the calls were first seen
}

// CallChange is a call some of whose captures would take another route
// than they took.
type CallChange struct {
	CallID   string   `json:"call_id"`
	Took     []string `json:"took"`     // the routes its captures took, first taken first
	Would    []string `json:"would"`    // the routes they would take
	Captures int      `json:"captures"` // how many would change
}

// NewTally returns a Tally for the routes of t, each counted from zero.
func NewTally(t *Table) *Tally {
	ty := &Tally{calls: map[string]*CallChange{}, report: Report{Routes: map[string]int{}, ChangedCalls: []CallChange{}}}
	for _, r := range t.routes {
		ty.report.Routes[r.Name] = 0
		ty.report.Order = append(ty.report.Order, r.Name)
	}
	return ty
}

// Add counts one capture: d is where the file would send it, took the
// name of the route it took.
func (ty *Tally) Add(d Decision, took string) {
	would := d.Name()
	ty.report.Captures++
	if _, ok := ty.report.Routes[would]; !ok {
		ty.report.Order = append(ty.report.Order, would)
	}
	ty.report.Routes[would]++
	changed := would != took
	if changed {
		ty.report.ChangedCaptures++
	}
	if d.CallID == "" {
		return
	}
	c := ty.calls[d.CallID]
	if c == nil {
		c = &CallChange{CallID: d.CallID}
		ty.calls[d.CallID] = c
		ty.order = append(ty.order, d.CallID)
	}
	c.Took = addOnce(c.Took, took)
	c.Would = addOnce(c.Would, would)
	if changed {
		c.Captures++
	}
}

func addOnce(names []string, name string) []string {
	for _, n := range names {
		if n == name {
			return names
		}
	}
	return append(names, name)
}

// Report is what the tally counted.
func (ty *Tally) Report() Report {
	r := ty.report
	r.ChangedCalls = []CallChange{}
	for _, id := range ty.order {
		if c := ty.calls[id]; c.Captures > 0 {
			r.ChangedCalls = append(r.ChangedCalls, *c)
		}
	}
	return r
}
