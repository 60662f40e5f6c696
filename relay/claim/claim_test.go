package claim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
)

const event = `{"id":"d1","event":"call.started","call":{"call_id":"c-1","to_number":"+15550001","attempt_number":2,
 "variables":{"developer":"alice","quote":"a\"b","nested":{"x":[1,{"y":"}"}]}},"contact":null},"data":{"call":{"call_id":"other"}}}`

func TestParse(t *testing.T) {
	good := map[string]string{
		"call.variables.developer=alice": "call.variables.developer=alice",
		"header:x-developer=alice":       "header:X-Developer=alice",
		"call.to_number=+15550001":       "call.to_number=+15550001",
		"a=b=c":                          "a=b=c",
	}
	for in, want := range good {
		c, err := Parse(in)
		if err != nil || c.String() != want {
			t.Errorf("Parse(%q) = %q, %v; want %q", in, c.String(), err, want)
		}
	}
	for _, bad := range []string{"", "alice", "a=b\tc", "call..x=1", ".x=1", "x=", "header:=a", "header:a b=c", "header:x", " a=b", strings.Repeat("a", MaxLen) + "=b", strings.Repeat("a.", MaxDepth) + "a=b"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) took it", bad)
		}
	}
}

func TestSetKeyIgnoresOrderAndRepeats(t *testing.T) {
	a, _ := ParseSet([]string{"x=1", "header:y=2"})
	b, _ := ParseSet([]string{"header:Y=2", "x=1", "x=1"})
	if a.Key() != b.Key() || len(b) != 2 || a.Key() == "" {
		t.Fatalf("keys %q %q, %v", a.Key(), b.Key(), b.Strings())
	}
	if (Set{}).Key() != "" {
		t.Fatal("the empty set has a key")
	}
	c, _ := ParseSet([]string{"x=1", "z=3"})
	if got, ok := a.Shares(c); !ok || got.String() != "x=1" {
		t.Fatalf("Shares = %v %v", got, ok)
	}
}

func TestMatch(t *testing.T) {
	h := http.Header{"X-Developer": {"bob"}}
	r := NewRequest([]byte(event), h.Get)
	cases := map[string]bool{
		"call.variables.developer=alice": true,
		"call.variables.developer=bob":   false,
		"call.attempt_number=2":          true,
		"call.variables.quote=a\"b":      true,
		"call.contact=null":              true,
		"call.variables=x":               false, // an object matches nothing
		"call.call_id=other":             false,
		"data.call.call_id=other":        true,
		"header:x-developer=bob":         true,
		"header:x-developer=alice":       false,
		"missing.path=x":                 false,
	}
	for expr, want := range cases {
		c, err := Parse(expr)
		if err != nil {
			t.Fatal(err)
		}
		if got := c.Matches(r); got != want {
			t.Errorf("%s matches = %v, want %v", expr, got, want)
		}
	}
	if r.CallID() != "c-1" {
		t.Fatalf("CallID = %q", r.CallID())
	}
	for _, body := range []string{"", "not json", `["call"]`, `{"call":{"call_id":"c-1"`, `{"call":{"call_id":"c-1"}} trailing`} {
		if got := NewRequest([]byte(body), nil).CallID(); got != "" {
			t.Errorf("CallID(%q) = %q, want none", body, got)
		}
	}
}

// FuzzLookup checks the in-place reader against encoding/json's decoding.
func FuzzLookup(f *testing.F) {
	f.Add([]byte(event), "call.variables.developer")
	f.Add([]byte(`{"a":{"b":"\u0041"},"a":{"b":1}}`), "a.b")
	f.Add([]byte(`{"a\"":1}`), `a"`)
	f.Fuzz(func(t *testing.T, body []byte, path string) {
		segs := strings.Split(path, ".")
		got, ok := NewRequest(body, nil).Lookup(segs)
		want, wok := decoded(body, segs)
		if ok != wok || got != want {
			t.Fatalf("Lookup(%q, %q) = %q %v; encoding/json says %q %v", body, path, got, ok, want, wok)
		}
	})
}

func decoded(body []byte, path []string) (string, bool) {
	var v any
	d := json.NewDecoder(strings.NewReader(string(body)))
	d.UseNumber()
	if !json.Valid(body) || d.Decode(&v) != nil {
		return "", false
	}
	for _, k := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return "", false
		}
		if v, ok = m[k]; !ok {
			return "", false
		}
	}
	switch x := v.(type) {
	case string:
		return x, true
	case json.Number:
		return string(x), true
	case bool:
		return fmt.Sprint(x), true
	case nil:
		return "null", true
	}
	return "", false
}

func BenchmarkMatch(b *testing.B) {
	s, _ := ParseSet([]string{"call.variables.developer=zed", "call.to_number=+19990000", "header:X-Dev=zed"})
	body := []byte(event)
	h := http.Header{}
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		r := NewRequest(body, h.Get)
		_ = r.CallID()
		s.Matches(r)
	}
}
