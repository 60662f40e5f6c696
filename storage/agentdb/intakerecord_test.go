package agentdb

import (
	"slices"
	"strings"
	"testing"

	"github.com/calltap/calltap/storage/intake"
)

// batchSize, the room LogCaptures allocates for a call's frames at once,
// covers them, however long the fields it counts are: the frames are
// never copied to a larger buffer.
func TestBatchSizeCoversTheFrames(t *testing.T) {
	long := strings.Repeat("x", 4000)
	c := testCapture(1, []byte(long))
	c.Path, c.Query, c.RequestHeaders = "/"+long, "q="+long, `[["X-Long","`+long+`"]]`
	u := answeredCapture(c)
	u.ResponseHeaders, u.ResponseBody, u.Error = `[["X-Long","`+long+`"]]`, []byte(long), long
	var buf []byte
	for _, tc := range []struct {
		name             string
		inserts, updates []*Capture
	}{
		{"an insert", []*Capture{c}, nil},
		{"an update", nil, []*Capture{u}},
	} {
		buf = buf[:0]
		for _, c := range tc.inserts {
			buf, _ = intake.AppendFrame(buf, func(b []byte) []byte { return encodeInsert(b, c, "") })
		}
		for _, c := range tc.updates {
			buf, _ = intake.AppendFrame(buf, func(b []byte) []byte { return encodeUpdate(b, c) })
		}
		if n := batchSize(tc.inserts, tc.updates); n < len(buf) {
			t.Errorf("%s: batchSize %d, frames %d bytes", tc.name, n, len(buf))
		}
	}
}

// A record with bytes past its last field, or of no known kind, or empty,
// is malformed, not read as far as it goes.
func TestDecodeRecordRefusesWhatIsNotARecord(t *testing.T) {
	u := answeredCapture(testCapture(1, nil))
	update := encodeUpdate(nil, u)
	insert := encodeInsert(nil, testCapture(2, []byte(`{}`)), "")
	for name, rec := range map[string][]byte{
		"an update and a byte more": append(slices.Clip(update), 0),
		"an insert and a byte more": append(slices.Clip(insert), 0),
		"a kind unknown":            append([]byte{9}, update[1:]...),
		"empty":                     {},
	} {
		if _, _, _, err := decodeRecord(rec); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
	for name, rec := range map[string][]byte{"an update": update, "an insert": insert} {
		if _, _, _, err := decodeRecord(rec); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}
