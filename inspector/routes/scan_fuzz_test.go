package routes

import (
	"encoding/json"
	"testing"
	"unicode/utf8"
)

// The scanner reads untrusted bodies on the agent's path: it never panics,
// and on valid JSON it finds what encoding/json finds.
func FuzzScan(f *testing.F) {
	f.Add([]byte(analysisEvent))
	f.Add([]byte(`{"event":"call.ended","call":{"call_id":"a\"b","variables":{"developer":"al\u0069ce"}}}`))
	f.Add([]byte(`{"call":[1,{"call_id":"x"}],"event":null}`))
	f.Add([]byte(`{"event":"\`))
	tb, err := Parse("routes.toml", []byte("[[route]]\nname = \"a\"\nmatch = { \"call.variables.developer\" = \"*\" }\nstore-only = true\n"))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		d := tb.Match(Request{Body: body})
		// A map, not a struct: encoding/json matches a struct's field names
		// without regard to case, the routes do not. Invalid UTF-8 it
		// replaces, the routes compare as sent.
		var doc map[string]any
		if !utf8.Valid(body) || json.Unmarshal(body, &doc) != nil {
			return
		}
		if s, _ := doc["event"].(string); s != d.Event {
			t.Fatalf("event %q, encoding/json %q", d.Event, s)
		}
		call, _ := doc["call"].(map[string]any)
		if s, _ := call["call_id"].(string); s != d.CallID {
			t.Fatalf("call id %q, encoding/json %q", d.CallID, s)
		}
	})
}
