package intake

import (
	"bytes"
	"path/filepath"
	"testing"
)

// A segment gives back every body appended to it, whatever its size
// against O_DIRECT's blocks and the chunks it is written in, and a full
// segment is followed by a new one.
func TestSegmentAppend(t *testing.T) {
	seg := &Bodies{dir: filepath.Join(t.TempDir(), "agent-bodies")}
	defer seg.Close()
	type at struct {
		name   string
		offset int64
		body   []byte
	}
	var saved []at
	for _, n := range []int{1, directAlign - 1, directAlign, directChunk, directChunk + 1, 3*directChunk + 4097, 0, 17} {
		body := make([]byte, n)
		for i := range body {
			body[i] = byte(i*31 + n)
		}
		name, off, err := seg.Append(body)
		if err != nil {
			t.Fatalf("%d bytes: %v", n, err)
		}
		if off%directAlign != 0 {
			t.Errorf("%d bytes at offset %d, not aligned", n, off)
		}
		saved = append(saved, at{name, off, body})
	}
	seg.size = segmentMax // as if full
	name, off, err := seg.Append([]byte("next"))
	if err != nil || name == saved[0].name || off != 0 {
		t.Errorf("after a full segment: %q at %d, %v (first was %q)", name, off, err, saved[0].name)
	}
	saved = append(saved, at{name, off, []byte("next")})
	for _, s := range saved {
		got, err := ReadBody(seg.dir, s.name, s.offset, int64(len(s.body)))
		if err != nil || !bytes.Equal(got, s.body) {
			t.Errorf("%d bytes at %s:%d: read back %d bytes, %v", len(s.body), s.name, s.offset, len(got), err)
		}
	}
	for _, bad := range []string{"", "..", "../agent.db", `a\b`} {
		if _, err := ReadBody(seg.dir, bad, 0, 1); err == nil {
			t.Errorf("segment name %q was read", bad)
		}
	}
}
