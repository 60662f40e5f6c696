package intake

import (
	"slices"
	"testing"
)

// A reserve's payloads end at the zero frame, at the data's end, or at a
// frame that does not hold (cut short, or its checksum wrong).
func TestReservedEnds(t *testing.T) {
	frame := func(b []byte, payload string) []byte {
		b, _ = AppendFrame(b, func(b []byte) []byte { return append(b, payload...) })
		return b
	}
	one := frame(nil, "first")
	two := frame(one, "second!")
	cut := func(b []byte, short int) []byte { return b[:len(b)-short] }
	badSum := frame(one, "second!")
	badSum[len(badSum)-1] ^= 1
	for _, tc := range []struct {
		name string
		data []byte
		want []string
	}{
		{"nothing", nil, nil},
		{"the zero frame", make([]byte, 8), nil},
		{"one, then the zero frame", append(frame(nil, "first"), make([]byte, 8)...), []string{"first"}},
		{"one, at the end", one, []string{"first"}},
		{"two, at the end", two, []string{"first", "second!"}},
		{"one, then one cut short", cut(two, 4), []string{"first"}},
		{"one, then one cut short by a byte", cut(two, 1), []string{"first"}},
		{"one, then a header cut short", cut(two, 12), []string{"first"}},
		{"one, then a wrong checksum", badSum, []string{"first"}},
	} {
		var got []string
		for _, r := range reserved(tc.data) {
			got = append(got, string(r))
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
