package callevent

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// has reports whether findings include code at path with severity.
func has(fs []Finding, code, sev, path string) bool {
	for _, f := range fs {
		if f.Code == code && f.Severity == sev && f.Path == path {
			return true
		}
	}
	return false
}

func errorsOf(fs []Finding) []Finding {
	var out []Finding
	for _, f := range fs {
		if f.Severity == SevError {
			out = append(out, f)
		}
	}
	return out
}

func TestCheckCleanPayloads(t *testing.T) {
	for _, name := range []string{"analysis_completed.json", "failed.json"} {
		fs := Check(readFixture(t, name))
		if errs := errorsOf(fs); len(errs) > 0 {
			t.Errorf("%s: unexpected errors %+v", name, errs)
		}
		for _, f := range fs {
			if f.Severity == SevWarning {
				t.Errorf("%s: unexpected warning %+v", name, f)
			}
		}
		if !has(fs, CodeUnstableData, SevInfo, "data") {
			t.Errorf("%s: data not flagged as unstable: %+v", name, fs)
		}
	}
}

func TestCheckFindsEachContractBreach(t *testing.T) {
	fs := Check(readFixture(t, "broken.json"))
	want := []struct{ code, sev, path string }{
		{CodeUUID, SevError, "id"},
		{CodeTimestamp, SevError, "occurred_at"},
		{CodeUUID, SevError, "call.call_id"},
		{CodePhone, SevError, "call.from_number"},
		{CodePhone, SevWarning, "call.to_number"},
		{CodeOrder, SevError, "call.answered_at"},
		{CodeOrder, SevError, "call.ended_at"},
		{CodeOutcomeMissing, SevError, "call.outcome_code"},
		{CodeInconsistent, SevWarning, "call.answered_at"},
		{CodeUnknownField, SevInfo, "tenant"},
		{CodeUnknownField, SevInfo, "call.queue"},
		{CodeUnstableData, SevInfo, "data"},
	}
	for _, w := range want {
		if !has(fs, w.code, w.sev, w.path) {
			t.Errorf("missing finding %s/%s at %s", w.code, w.sev, w.path)
		}
	}
	// Errors come first.
	seenNonError := false
	for _, f := range fs {
		if f.Severity != SevError {
			seenNonError = true
		} else if seenNonError {
			t.Errorf("error after a lesser finding: %+v", fs)
			break
		}
	}
}

// mutate decodes the fixture, applies edits and re-encodes it.
func mutate(t *testing.T, name string, edit func(m map[string]any)) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(readFixture(t, name), &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestCheckPoints(t *testing.T) {
	call := func(m map[string]any) map[string]any { return m["call"].(map[string]any) }
	cases := []struct {
		name      string
		fixture   string
		edit      func(m map[string]any)
		code, sev string
		path      string
	}{
		{"missing id", "failed.json", func(m map[string]any) { delete(m, "id") }, CodeMissing, SevError, "id"},
		{"missing event", "failed.json", func(m map[string]any) { delete(m, "event") }, CodeMissing, SevError, "event"},
		{"missing occurred_at", "failed.json", func(m map[string]any) { delete(m, "occurred_at") }, CodeMissing, SevError, "occurred_at"},
		{"missing call", "failed.json", func(m map[string]any) { delete(m, "call") }, CodeMissing, SevError, "call"},
		{"missing data", "failed.json", func(m map[string]any) { delete(m, "data") }, CodeMissing, SevWarning, "data"},
		{"call not object", "failed.json", func(m map[string]any) { m["call"] = "x" }, CodeWrongType, SevError, "call"},
		{"occurred_at without offset", "failed.json", func(m map[string]any) { m["occurred_at"] = "2025-03-14T16:00:30" }, CodeNoOffset, SevError, "occurred_at"},
		{"occurred_at a number", "failed.json", func(m map[string]any) { m["occurred_at"] = 1741968030 }, CodeWrongType, SevError, "occurred_at"},
		{"occurred_at bad date", "failed.json", func(m map[string]any) { m["occurred_at"] = "2025-02-30T00:00:00Z" }, CodeTimestamp, SevError, "occurred_at"},
		{"unknown event", "failed.json", func(m map[string]any) { m["event"] = "call.transferred" }, CodeUnknownEvent, SevWarning, "event"},
		{"call_id not uuid", "failed.json", func(m map[string]any) { call(m)["call_id"] = "42" }, CodeUUID, SevError, "call.call_id"},
		{"to_number without +", "failed.json", func(m map[string]any) { call(m)["to_number"] = "07700900123" }, CodePhone, SevError, "call.to_number"},
		{"outcome_code empty on failed", "failed.json", func(m map[string]any) { call(m)["outcome_code"] = "" }, CodeOutcomeMissing, SevError, "call.outcome_code"},
		{"outcome_code absent on failed", "failed.json", func(m map[string]any) { delete(call(m), "outcome_code") }, CodeOutcomeMissing, SevError, "call.outcome_code"},
		{"duration off by 3s", "analysis_completed.json", func(m map[string]any) { call(m)["duration_seconds"] = 97 }, CodeDuration, SevError, "call.duration_seconds"},
		{"duration not integer", "analysis_completed.json", func(m map[string]any) { call(m)["duration_seconds"] = 94.5 }, CodeWrongType, SevWarning, "call.duration_seconds"},
		{"ended before started", "analysis_completed.json", func(m map[string]any) {
			call(m)["answered_at"] = nil
			call(m)["ended_at"] = "2025-03-14T15:00:00+00:00"
		}, CodeOrder, SevError, "call.ended_at"},
		{"analysis missing", "analysis_completed.json", func(m map[string]any) { delete(m, "analysis") }, CodeMissing, SevError, "analysis"},
		{"media missing", "analysis_completed.json", func(m map[string]any) { delete(m, "media") }, CodeMissing, SevError, "media"},
		{"lead_score a string", "analysis_completed.json", func(m map[string]any) { m["analysis"].(map[string]any)["lead_score"] = "0.8" }, CodeWrongType, SevError, "analysis.lead_score"},
		{"lead_score missing", "analysis_completed.json", func(m map[string]any) { delete(m["analysis"].(map[string]any), "lead_score") }, CodeMissing, SevError, "analysis.lead_score"},
		{"lead_score null", "analysis_completed.json", func(m map[string]any) { m["analysis"].(map[string]any)["lead_score"] = nil }, CodeWrongType, SevError, "analysis.lead_score"},
		{"unknown analysis field", "analysis_completed.json", func(m map[string]any) { m["analysis"].(map[string]any)["topics"] = []any{"pricing"} }, CodeUnknownField, SevInfo, "analysis.topics"},
		{"connected without answered_at", "failed.json", func(m map[string]any) {
			m["event"] = KindConnected
			call(m)["outcome_code"] = nil
		}, CodeInconsistent, SevWarning, "call.answered_at"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fs := Check(mutate(t, tc.fixture, tc.edit))
			if !has(fs, tc.code, tc.sev, tc.path) {
				t.Errorf("want %s/%s at %s, got %+v", tc.code, tc.sev, tc.path, fs)
			}
		})
	}
}

func TestCheckDurationWithinASecond(t *testing.T) {
	b := mutate(t, "analysis_completed.json", func(m map[string]any) { m["call"].(map[string]any)["duration_seconds"] = 95 })
	if fs := Check(b); has(fs, CodeDuration, SevError, "call.duration_seconds") {
		t.Errorf("94.4 s vs 95 flagged: %+v", fs)
	}
}

func TestCheckNeverFails(t *testing.T) {
	for _, body := range []string{"", "x", "[]", "null", `"call.ended"`, `{}`, `{"call":null}`, `{"event":"call.ended"} {}`} {
		fs := Check([]byte(body))
		if len(fs) == 0 {
			t.Errorf("%q: no findings", body)
		}
	}
	if fs := Check([]byte("[]")); !has(fs, CodeNotJSON, SevError, "") {
		t.Errorf("array: %+v", fs)
	}
}

func TestCheckMessagesAreShort(t *testing.T) {
	long := strings.Repeat("x", 10000)
	fs := Check([]byte(`{"id":"` + long + `","event":"call.ended","call":{}}`))
	for _, f := range fs {
		if len(f.Message) > 400 {
			t.Errorf("message of %d bytes: %.100s…", len(f.Message), f.Message)
		}
	}
}

func TestParseTime(t *testing.T) {
	cases := []struct {
		in       string
		want     time.Time
		noOffset bool
		bad      bool
	}{
		{in: "2025-03-14T15:12:40.120000+00:00", want: time.Date(2025, 3, 14, 15, 12, 40, 120000000, time.UTC)},
		{in: "2025-03-14T15:12:40Z", want: time.Date(2025, 3, 14, 15, 12, 40, 0, time.UTC)},
		{in: "2025-03-14T17:12:40+02:00", want: time.Date(2025, 3, 14, 15, 12, 40, 0, time.UTC)},
		{in: "2025-03-14T10:12:40-0500", want: time.Date(2025, 3, 14, 15, 12, 40, 0, time.UTC)},
		{in: "2025-03-14T15:12+00", want: time.Date(2025, 3, 14, 15, 12, 0, 0, time.UTC)},
		{in: "2025-03-14T15:12:40.123456789123Z", want: time.Date(2025, 3, 14, 15, 12, 40, 123456789, time.UTC)},
		{in: "2025-03-14T15:12:40", want: time.Date(2025, 3, 14, 15, 12, 40, 0, time.UTC), noOffset: true},
		{in: "2025-03-14 15:12:40Z", bad: true},
		{in: "2025-13-01T00:00:00Z", bad: true},
		{in: "2024-02-29T00:00:00Z", want: time.Date(2024, 2, 29, 0, 0, 0, 0, time.UTC)},
		{in: "2025-02-29T00:00:00Z", bad: true},
		{in: "2025-03-14T24:00:00Z", bad: true},
		{in: "2025-03-14T15:12:40+25:00", bad: true},
		{in: "yesterday", bad: true},
		{in: "", bad: true},
	}
	for _, tc := range cases {
		got, err := ParseTime(tc.in)
		switch {
		case tc.bad:
			if err == nil || err == ErrNoOffset {
				t.Errorf("%q: accepted as %v", tc.in, got)
			}
		case tc.noOffset:
			if err != ErrNoOffset || !got.Equal(tc.want) {
				t.Errorf("%q: %v %v", tc.in, got, err)
			}
		default:
			if err != nil || !got.Equal(tc.want) {
				t.Errorf("%q: %v %v, want %v", tc.in, got, err, tc.want)
			}
		}
	}
}

// An event stamped as occurring after it was received is flagged (a clock
// ahead of ours, or a synthetic event); one a moment before, or within the
// tolerance for clocks, is not.
func TestCheckReceivedFlagsAnEventFromTheFuture(t *testing.T) {
	p := CallSpec{Start: time.Date(2026, 1, 2, 10, 0, 0, 0, time.UTC)}.Events()[2] // call.ended
	body, _ := json.Marshal(p)
	occurred, _ := ParseTime(p.OccurredAt)
	for _, c := range []struct {
		received time.Time
		flagged  bool
	}{
		{occurred.Add(-7 * time.Second), true},
		{occurred.Add(-FutureTolerance / 2), false},
		{occurred.Add(3 * time.Second), false},
		{time.Time{}, false},
	} {
		fs := CheckReceived(body, c.received)
		if got := has(fs, CodeFuture, SevWarning, "occurred_at"); got != c.flagged {
			t.Errorf("received %s after occurred_at: flagged %v, want %v (%+v)", c.received.Sub(occurred), got, c.flagged, fs)
		}
	}
	for _, f := range CheckReceived(body, occurred.Add(-time.Minute)) {
		if f.Code == CodeFuture && !strings.Contains(f.Message, "1m0s after the event was received") {
			t.Errorf("message: %q", f.Message)
		}
	}
}
