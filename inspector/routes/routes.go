// Package routes is calltap's route file: which local handler each captured
// webhook goes to, decided per request from the request alone and from what
// the request's call sent before.
//
// A route file is TOML, kept in the developer's repository. Each [[route]]
// table names a route and says which requests it takes and where they go:
//
//	# routes.toml
//	[[route]]
//	name = "alice"                      # unique, letters, digits, . _ -
//	match = { "call.variables.developer" = "alice" }
//	forward-to = "http://127.0.0.1:3001/hooks"
//
//	[[route]]
//	name = "media"
//	events = ["call.recording_available", "call.analysis_*"]
//	forward-to = "http://127.0.0.1:4000"
//
//	[[route]]
//	name = "quiet"
//	events = ["call.connected"]
//	store-only = true
//
// A route's criteria are any of:
//   - events: a list of event kinds (the body's "event"), each a glob as
//     path.Match reads it ("call.*"); one of them must match.
//   - match: JSON dot paths into the body ("call.variables.developer", no
//     array indexes) mapped to a value. A string field matches its text, a
//     number or boolean its JSON text ("42", "true"); "*" matches any value
//     that is present and not null. Every entry must match.
//   - header: header name to value, any of the header's values; "*" for
//     present. Every entry must match.
//   - path: a glob on the path after the tunnel ("/hooks/*"; * stops at /).
//
// All the criteria a route gives must hold. A route gives at least one: a
// catch-all is written events = ["*"], so that none is made by accident.
// Each route has exactly one of forward-to (an absolute http or https URL;
// the rest of the tunnel path and the query are appended to it, as with
// --forward-to) and store-only = true (captured, sent nowhere). Routes are
// tried in file order and the first that matches wins; a request no route
// takes goes to the default: --forward-to when given, else stored only.
//
// A call stays together. The events of a call do not all carry the same
// fields, so a match on a field a later event lacks uses the value the
// call's earlier events had, keyed by call.call_id and kept in a CallValues
// the table is given. Event-kind criteria still apply per event.
//
// The table may also be given an event filter (--events): a request whose
// kind matches none of its globs is stored only, whatever the routes say.
package routes

import (
	"net/http"
	"net/url"
	"sync"
)

// Names a Decision gives to requests that no route of the file took; a
// route may not use them.
const (
	DefaultName  = "default"  // no route matched: --forward-to, or stored only
	FilteredName = "filtered" // left out by the event filter: stored only
)

// Route is one [[route]] of a file, checked.
type Route struct {
	Name      string
	Line      int      // of its [[route]] header
	ForwardTo *url.URL // nil when StoreOnly
	StoreOnly bool

	events []string     // globs; any may match
	match  []matchEntry // all must match
	header []headerEntry
	path   string // glob; "" for any
}

type matchEntry struct {
	path string // the dot path, the CallValues key
	slot int    // into the fields one scan of the body fills
	want string // "*": present
}

type headerEntry struct {
	name string // canonical
	want string // "*": present
}

// Table is a checked route file, ready to match requests. It is safe for
// concurrent use when its CallValues is.
type Table struct {
	routes []*Route
	fields *trie    // the body fields Match reads, in one pass
	paths  []string // the match paths, by slot (slot 0 and 1 are event and call id)
	events []string // the event filter; nil: none

	usesHeaders bool // a route has header criteria (UsesHeaders); set by parse
	calls       CallValues

	scratch sync.Pool // of *[]field, one per path: Match's fields
}

// CallValues is the memory of what a call's events carried at the table's
// match paths, so that a later event lacking a field is routed on the value
// its call had. The agent's store backs it, so that it holds across
// restarts and for replays; Memory is the in-memory one.
type CallValues interface {
	// Get is the value the call's events last had at dotPath.
	Get(callID, dotPath string) (string, bool)
	// Remember records the value an event of the call has at dotPath.
	Remember(callID, dotPath, value string)
}

// Option configures a Table.
type Option func(*Table)

// WithEvents keeps the table's routes for requests whose event kind
// matches one of globs; the rest are stored only (FilteredName).
func WithEvents(globs []string) Option {
	return func(t *Table) { t.events = globs }
}

// WithCallValues gives the table the memory of what each call's events
// carried, so that a call stays together.
func WithCallValues(cv CallValues) Option {
	return func(t *Table) { t.calls = cv }
}

// Request is what Match reads of a request.
type Request struct {
	Body   []byte
	Header http.Header
	Path   string // after the tunnel
	Event  string // the event kind when the caller has it; else read from Body
}

// Decision is where a request goes.
type Decision struct {
	Route    *Route // nil: no route took it
	Filtered bool   // left out by the event filter: stored only
	Event    string // the event kind Match used
	CallID   string // the body's call.call_id; "" when none
}

// Name is the route's name, or DefaultName or FilteredName.
func (d Decision) Name() string {
	switch {
	case d.Filtered:
		return FilteredName
	case d.Route == nil:
		return DefaultName
	}
	return d.Route.Name
}
