package callevent

import (
	"encoding/json"
	"testing"
	"time"
)

// A delivery record's times read as the service may write them (RFC 3339
// with or without fractions or zone, a space for the T) and are written
// back in UTC with microseconds; null and "" are no time.
func TestTimestampReadsAndWritesTheServicesTimes(t *testing.T) {
	want := time.Date(2026, 11, 28, 14, 3, 9, 250000000, time.UTC)
	for _, in := range []string{`"2026-11-28T14:03:09.25Z"`, `"2026-11-28T15:03:09.25+01:00"`, `"2026-11-28T14:03:09.25"`, `"2026-11-28 14:03:09.25Z"`} {
		var ts Timestamp
		if err := json.Unmarshal([]byte(in), &ts); err != nil || !ts.Equal(want) {
			t.Errorf("%s: %v, %v; want %v", in, ts.Time, err, want)
		}
		out, err := json.Marshal(ts)
		if err != nil || string(out) != `"2026-11-28T14:03:09.250000Z"` {
			t.Errorf("%s written back: %s, %v", in, out, err)
		}
	}
	for _, in := range []string{`null`, `""`} {
		ts := Timestamp{Time: want}
		if err := json.Unmarshal([]byte(in), &ts); err != nil || !ts.IsZero() {
			t.Errorf("%s: %v, %v; want no time", in, ts.Time, err)
		}
		if out, _ := json.Marshal(ts); string(out) != "null" {
			t.Errorf("%s written back: %s, want null", in, out)
		}
	}
	var ts Timestamp
	if err := json.Unmarshal([]byte(`"yesterday"`), &ts); err == nil {
		t.Error("yesterday read as a time")
	}
}
