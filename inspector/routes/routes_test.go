package routes

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
)

const goodFile = `# routes of a team
[[route]]
name = "alice"
match = { "call.variables.developer" = "alice" }
forward-to = "http://127.0.0.1:3001/hooks"

[[route]]
name = "media"
events = ["call.recording_available", "call.analysis_*"]
forward-to = "https://127.0.0.1:4000"

[[route]]
name = "signed"
header = { "x-team" = "*" }
path = "/team/*"
forward-to = "http://127.0.0.1:5000"

[[route]]
name = "quiet"
events = ["call.connected"]
store-only = true

[[route]]
name = "bob"
forward-to = "http://127.0.0.1:3002"
[route.match]
"call.variables.developer" = "bob"
"call.attempt_number" = "2"
`

func mustParse(t *testing.T, src string, opts ...Option) *Table {
	t.Helper()
	tb, err := Parse("routes.toml", []byte(src), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return tb
}

// Every refusal names the file, the line of the key at fault, and what is
// wrong.
func TestParseErrorsNameFileAndLine(t *testing.T) {
	for _, tc := range []struct{ src, want string }{
		{"[[route]]\nname = \"a\"\nevents = [\"*\"]\nforward-to = \"http://x\"\nstore-only = true\n", `routes.toml:5: route "a": forward-to and store-only both set`},
		{"[[route]]\nname = \"a\"\nevents = [\"*\"]\n", `routes.toml:2: route "a": neither forward-to nor store-only = true`},
		{"[[route]]\nname = \"a\"\nevents = [\"*\"]\nforward-to = \"/local\"\n", `routes.toml:4: route "a": forward-to "/local": not an absolute http or https URL`},
		{"[[route]]\nname = \"a\"\nevents = [\"*\"]\nforward-to = \"ftp://x\"\n", `routes.toml:4: route "a": forward-to "ftp://x"`},
		{"[[route]]\nname = \"a\"\nstore-only = true\n", `routes.toml:2: route "a": no events, match, header or path`},
		{"[[route]]\nname = \"a\"\nstore-only = true\nevents = [\"*\"]\n\n[[route]]\nname = \"a\"\nstore-only = true\nevents = [\"*\"]\n", `routes.toml:7: route "a": name already used by the route at line 1`},
		{"[[route]]\nname = \"\"\nstore-only = true\nevents = [\"*\"]\n", `routes.toml:2: route "": name must be`},
		{"[[route]]\nname = \"default\"\nstore-only = true\nevents = [\"*\"]\n", `routes.toml:2: route "default": name must be`},
		{"[[route]]\nname = \"a\"\nstore-only = true\nevents = [\"call.[\"]\n", `routes.toml:4: route "a": events: "call.[": syntax error in pattern`},
		{"[[route]]\nname = \"a\"\nstore-only = true\npath = \"/[\"\n", `routes.toml:4: route "a": path "/["`},
		{"[[route]]\nname = \"a\"\nstore-only = true\nmatch = { \"call..x\" = \"1\" }\n", `routes.toml:4: route "a": match "call..x": not a dot path`},
		{"[[route]]\nname = \"a\"\nstore-only = true\n[route.match]\nok = \"1\"\n\"call.\" = \"1\"\n", `routes.toml:6: route "a": match "call.": not a dot path`},
		{"[[route]]\nname = \"a\"\nstore-only = true\nheader = { \"bad name\" = \"1\" }\n", `routes.toml:4: route "a": header "bad name": not a header name`},
		{"[[route]]\nname = \"a\"\nstore-only = true\nevents = [\"*\"]\nforward_to = \"http://x\"\n", `routes.toml:5: unknown key "route.forward_to"`},
		{"[[route]]\nname = \"a\"\nevents = [\"*\"\n", `routes.toml:3: `},
		{"[[route]]\nname = \"a\"\nstore-only = \"yes\"\n", `routes.toml:3: `},
		{"[[route]]\nname = \"a\"\nstore-only = true\nmatch = { x = 1 }\n", `routes.toml:4: `},
	} {
		_, err := Parse("routes.toml", []byte(tc.src))
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%q:\n got %v\nwant %s…", tc.src, err, tc.want)
		}
	}
}

func TestParseGood(t *testing.T) {
	tb := mustParse(t, goodFile)
	var names []string
	for _, r := range tb.routes {
		names = append(names, fmt.Sprintf("%s@%d", r.Name, r.Line))
	}
	if got := strings.Join(names, " "); got != "alice@2 media@7 signed@12 quiet@18 bob@23" {
		t.Fatalf("routes %s", got)
	}
	if r := tb.routes[3]; !r.StoreOnly || r.ForwardTo != nil {
		t.Fatalf("quiet: %+v", r)
	}
	if r := tb.routes[1]; r.ForwardTo.String() != "https://127.0.0.1:4000" {
		t.Fatalf("media: %v", r.ForwardTo)
	}
	if _, err := Parse("routes.toml", []byte(goodFile), WithEvents([]string{"call.["})); err == nil {
		t.Fatal("a bad event filter was taken")
	}
}

func event(kind, callID, extra string) []byte {
	return fmt.Appendf(nil, `{"id":"d","event":%q,"call":{"call_id":%q%s},"data":{"event":"x","room":{"sid":"r"}}}`, kind, callID, extra)
}

func TestMatchFirstRouteWins(t *testing.T) {
	tb := mustParse(t, goodFile)
	for _, tc := range []struct {
		body   []byte
		header http.Header
		path   string
		want   string
	}{
		{event("call.started", "c1", `,"variables":{"developer":"alice"}`), nil, "/", "alice"},
		{event("call.analysis_completed", "c2", `,"variables":{"developer":"alice"}`), nil, "/", "alice"},
		{event("call.analysis_completed", "c2", `,"variables":{"developer":"carol"}`), nil, "/", "media"},
		{event("call.started", "c3", ``), http.Header{"X-Team": {"a"}}, "/team/hooks", "signed"},
		{event("call.started", "c3", ``), http.Header{"X-Team": {"a"}}, "/team/a/b", "default"},
		{event("call.started", "c3", ``), nil, "/team/hooks", "default"},
		{event("call.connected", "c4", ``), nil, "/", "quiet"},
		{event("call.started", "c5", `,"attempt_number":2,"variables":{"developer":"bob"}`), nil, "/", "bob"},
		{event("call.started", "c5", `,"attempt_number":1,"variables":{"developer":"bob"}`), nil, "/", "default"},
		{event("call.started", "c6", `,"variables":{"developer":"al\u0069ce"}`), nil, "/", "alice"},
		{[]byte(`not json`), nil, "/", "default"},
		{[]byte(`{"event":"call.connected","call":{"call_id":`), nil, "/", "quiet"},
	} {
		d := tb.Match(Request{Body: tc.body, Header: tc.header, Path: tc.path})
		if d.Name() != tc.want {
			t.Errorf("%s %v %s: %s, want %s", tc.body, tc.header, tc.path, d.Name(), tc.want)
		}
	}
	d := tb.Match(Request{Body: event("call.started", "c7", ""), Event: "call.connected"})
	if d.Name() != "quiet" || d.CallID != "c7" || d.Event != "call.connected" {
		t.Fatalf("a kind the caller gives: %+v", d)
	}
}

// An empty events list is no criterion, not one that nothing meets.
func TestMatchEmptyEvents(t *testing.T) {
	tb := mustParse(t, "[[route]]\nname = \"a\"\nevents = []\nmatch = { \"call.call_id\" = \"c1\" }\nstore-only = true\n")
	if got := tb.Match(Request{Body: event("call.started", "c1", "")}).Name(); got != "a" {
		t.Fatalf("got %s", got)
	}
	if _, err := Parse("routes.toml", []byte("[[route]]\nname = \"a\"\nevents = []\nstore-only = true\n")); err == nil {
		t.Fatal("a route whose only criterion is an empty events list was taken")
	}
}

// A "*" match wants a value that is there and not null.
func TestMatchPresent(t *testing.T) {
	tb := mustParse(t, "[[route]]\nname = \"tagged\"\nmatch = { \"call.variables.tag\" = \"*\" }\nstore-only = true\n")
	for body, want := range map[string]string{
		`{"event":"call.started","call":{"variables":{"tag":"x"}}}`:  "tagged",
		`{"event":"call.started","call":{"variables":{"tag":0}}}`:    "tagged",
		`{"event":"call.started","call":{"variables":{"tag":{}}}}`:   "tagged",
		`{"event":"call.started","call":{"variables":{"tag":null}}}`: "default",
		`{"event":"call.started","call":{"variables":{}}}`:           "default",
		`{"event":"call.started","call":{"variables":"tag"}}`:        "default",
	} {
		if got := tb.Match(Request{Body: []byte(body)}).Name(); got != want {
			t.Errorf("%s: %s, want %s", body, got, want)
		}
	}
}

// A call stays together: the later events that lack the matched field go
// where the call's first event went; event-kind routes still apply per
// event; without a call memory, each event stands alone.
func TestMatchCallStaysTogether(t *testing.T) {
	src := "[[route]]\nname = \"quiet\"\nevents = [\"call.connected\"]\nstore-only = true\n\n" +
		"[[route]]\nname = \"alice\"\nmatch = { \"call.variables.developer\" = \"alice\" }\nforward-to = \"http://127.0.0.1:3001\"\n"
	calls := []struct{ body, want, alone string }{
		{string(event("call.started", "c1", `,"variables":{"developer":"alice"}`)), "alice", "alice"},
		{string(event("call.started", "c2", `,"variables":{"developer":"bob"}`)), "default", "default"},
		{string(event("call.connected", "c1", ``)), "quiet", "quiet"},
		{string(event("call.ended", "c1", ``)), "alice", "default"},
		{string(event("call.ended", "c2", ``)), "default", "default"},
		{string(event("call.analysis_completed", "c1", `,"variables":{"developer":"bob"}`)), "default", "default"},
		{string(event("call.failed", "c3", ``)), "default", "default"},
	}
	sticky := mustParse(t, src, WithCallValues(NewMemory()))
	alone := mustParse(t, src)
	for _, c := range calls {
		if got := sticky.Match(Request{Body: []byte(c.body)}).Name(); got != c.want {
			t.Errorf("with memory %s: %s, want %s", c.body, got, c.want)
		}
		if got := alone.Match(Request{Body: []byte(c.body)}).Name(); got != c.alone {
			t.Errorf("alone %s: %s, want %s", c.body, got, c.alone)
		}
	}
}

func TestMatchEventFilter(t *testing.T) {
	tb := mustParse(t, goodFile, WithEvents([]string{"call.started", "call.ended"}))
	for kind, want := range map[string]string{"call.started": "default", "call.ended": "default", "call.connected": "filtered", "": "filtered"} {
		if got := tb.Match(Request{Body: event(kind, "c", "")}).Name(); got != want {
			t.Errorf("%q: %s, want %s", kind, got, want)
		}
	}
}

// Many match paths read from one body, past the stack's room.
func TestMatchManyPaths(t *testing.T) {
	var src, fields strings.Builder
	for i := range maxStackFields + 4 {
		fmt.Fprintf(&src, "[[route]]\nname = \"r%d\"\nmatch = { \"call.variables.v%d\" = \"%d\" }\nstore-only = true\n", i, i, i)
		fmt.Fprintf(&fields, `,"v%d":"x"`, i)
	}
	tb := mustParse(t, src.String())
	last := maxStackFields + 3
	body := fmt.Sprintf(`{"event":"call.started","call":{"variables":{"z":[1,{"a":"}"}]%s,"v%d":"%d"}}}`, fields.String(), last, last)
	if got := tb.Match(Request{Body: []byte(body)}).Name(); got != fmt.Sprintf("r%d", last) {
		t.Fatalf("got %s", got)
	}
}
