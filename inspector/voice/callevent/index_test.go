package callevent

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// indexRef is Index written the slow, obvious way with encoding/json.
func indexRef(body []byte) (Indexed, bool) {
	if !json.Valid(body) {
		return Indexed{}, false
	}
	var top map[string]json.RawMessage
	if json.Unmarshal(body, &top) != nil || top == nil {
		return Indexed{}, false
	}
	str := func(raw json.RawMessage) string {
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return ""
		}
		return s
	}
	ix := Indexed{Event: str(top["event"]), DeliveryID: str(top["id"]), OccurredAt: str(top["occurred_at"])}
	raw, ok := top["call"]
	hasCall := ok && bytes.HasPrefix(bytes.TrimSpace(raw), []byte("{"))
	if hasCall {
		var call map[string]json.RawMessage
		json.Unmarshal(raw, &call)
		ix.CallID = str(call["call_id"])
	}
	if ix.Event == "" || (!hasCall && !IsKind(ix.Event)) {
		return Indexed{}, false
	}
	return ix, true
}

var indexCases = []struct {
	name string
	body string
	want Indexed
	ok   bool
}{
	{"documented", `{"id":"d1","event":"call.ended","occurred_at":"2025-01-01T00:00:00+00:00","call":{"call_id":"c1","status":"completed"},"data":{"room":{"sid":"x"}}}`,
		Indexed{Event: "call.ended", CallID: "c1", DeliveryID: "d1", OccurredAt: "2025-01-01T00:00:00+00:00"}, true},
	{"keys in any order, nesting skipped", ` { "data" : {"a":[1,2,{"call_id":"wrong"}],"b":"}"}, "call":{"contact":{"call_id":"nested"},"call_id":"c2"},"event":"call.started" } `,
		Indexed{Event: "call.started", CallID: "c2"}, true},
	{"unknown kind with call block", `{"event":"call.transferred","call":{"call_id":"c3"}}`, Indexed{Event: "call.transferred", CallID: "c3"}, true},
	{"documented kind without call block", `{"event":"call.failed","id":"d"}`, Indexed{Event: "call.failed", DeliveryID: "d"}, true},
	{"escapes decoded", `{"event":"call.\u0065nded","call":{"call_id":"a\"b\\c\/d"},"\u0069d":"x\ty"}`, Indexed{Event: "call.ended", CallID: `a"b\c/d`, DeliveryID: "x\ty"}, true},
	{"wrong types left empty", `{"id":5,"event":"call.ended","occurred_at":null,"call":{"call_id":["c"]}}`, Indexed{Event: "call.ended"}, true},
	{"call not an object", `{"event":"push","call":"c"}`, Indexed{}, false},
	{"other webhook", `{"event":"push","ref":"main"}`, Indexed{}, false},
	{"no event", `{"call":{"call_id":"c"}}`, Indexed{}, false},
	{"event not a string", `{"event":1,"call":{"call_id":"c"}}`, Indexed{}, false},
	{"empty object", `{}`, Indexed{}, false},
	{"array", `[{"event":"call.ended"}]`, Indexed{}, false},
	{"empty", ``, Indexed{}, false},
	{"form body", `event=call.ended`, Indexed{}, false},
	{"truncated", `{"event":"call.ended","call":{"call_id":"c"`, Indexed{}, false},
	{"trailing garbage", `{"event":"call.ended"} x`, Indexed{}, false},
	{"bad number", `{"event":"call.ended","n":01}`, Indexed{}, false},
	{"bad literal", `{"event":"call.ended","n":tru}`, Indexed{}, false},
	{"control char in string", "{\"event\":\"call.\nended\"}", Indexed{}, false},
	{"bad escape", `{"event":"call.ended","x":"\q"}`, Indexed{}, false},
	{"missing comma", `{"event":"call.ended" "id":"x"}`, Indexed{}, false},
	{"trailing comma", `{"event":"call.ended",}`, Indexed{}, false},
	{"duplicate key: last wins", `{"event":"call.started","event":"call.ended","call":{"call_id":"a"},"call":{}}`, Indexed{Event: "call.ended"}, true},
	{"numbers", `{"event":"call.ended","n":[-0.5e+10,0,12.25,1E3]}`, Indexed{Event: "call.ended"}, true},
}

func TestIndex(t *testing.T) {
	for _, tc := range indexCases {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := Index([]byte(tc.body))
			if ok != tc.ok || got != tc.want {
				t.Errorf("Index = %+v, %v; want %+v, %v", got, ok, tc.want, tc.ok)
			}
			ref, refOK := indexRef([]byte(tc.body))
			if ref != got || refOK != ok {
				t.Errorf("Index disagrees with encoding/json: %+v %v vs %+v %v", got, ok, ref, refOK)
			}
		})
	}
}

func TestIndexFixtures(t *testing.T) {
	ix, ok := Index(readFixture(t, "analysis_completed.json"))
	want := Indexed{Event: KindAnalysisCompleted, CallID: "0e8f3a52-6c1b-4d7e-9f20-3a4b5c6d7e8f",
		DeliveryID: "5b2f7c1e-8a4d-4f3b-9c2e-1d7a6b5c4e3f", OccurredAt: "2025-03-14T15:12:40.120000+00:00"}
	if !ok || ix != want {
		t.Errorf("got %+v %v", ix, ok)
	}
}

func TestIndexDeepNestingIsBounded(t *testing.T) {
	deep := `{"event":"call.ended","x":` + strings.Repeat("[", 20000) + strings.Repeat("]", 20000) + `}`
	if _, ok := Index([]byte(deep)); ok {
		t.Error("20000 levels of nesting accepted")
	}
	ok1 := `{"event":"call.ended","x":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`
	if _, ok := Index([]byte(ok1)); !ok {
		t.Error("100 levels of nesting refused")
	}
}

// FuzzIndex checks Index against encoding/json on arbitrary input; go test
// runs the seeds, go test -fuzz=FuzzIndex explores.
func FuzzIndex(f *testing.F) {
	for _, tc := range indexCases {
		f.Add([]byte(tc.body))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got, ok := Index(body)
		ref, refOK := indexRef(body)
		if got != ref || ok != refOK {
			t.Errorf("%q: Index = %+v %v, encoding/json = %+v %v", body, got, ok, ref, refOK)
		}
	})
}

func BenchmarkIndex(b *testing.B) {
	body := readFixture(b, "analysis_completed.json")
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := Index(body); !ok {
			b.Fatal("not indexed")
		}
	}
}

// BenchmarkIndexEncodingJSON is the baseline Index is measured against: the
// obvious struct decode.
func BenchmarkIndexEncodingJSON(b *testing.B) {
	body := readFixture(b, "analysis_completed.json")
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		var ev struct {
			ID         string `json:"id"`
			Event      string `json:"event"`
			OccurredAt string `json:"occurred_at"`
			Call       struct {
				CallID string `json:"call_id"`
			} `json:"call"`
		}
		if err := json.Unmarshal(body, &ev); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkIndexNotJSON(b *testing.B) {
	body := bytes.Repeat([]byte("x"), 64<<10)
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		Index(body)
	}
}

func BenchmarkIndexLargeData(b *testing.B) {
	var buf bytes.Buffer
	buf.WriteString(`{"id":"d","event":"call.ended","data":{"segments":[`)
	for i := 0; i < 5000; i++ {
		if i > 0 {
			buf.WriteByte(',')
		}
		buf.WriteString(`{"speaker":"agent","text":"Hello, this is Ava calling about your trial \u2014 is now a good time?","t":12.5}`)
	}
	buf.WriteString(`]},"call":{"call_id":"c"}}`)
	body := buf.Bytes()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := Index(body); !ok {
			b.Fatal("not indexed")
		}
	}
}
