package varfield

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"testing"
)

var errBad = errors.New("bad")

func TestRoundTrip(t *testing.T) {
	var b []byte
	b = binary.AppendUvarint(b, math.MaxUint64)
	b = binary.AppendVarint(b, -5)
	b = append(b, 0xab)
	b = AppendString(b, "héllo")
	b = AppendBytes(b, []byte{1, 2, 3})
	b = AppendString(b, "")
	b = append(b, "tail"...)

	d := NewDecoder(b, errBad)
	if got := d.Uvarint(); got != math.MaxUint64 {
		t.Errorf("Uvarint = %d", got)
	}
	if got := d.Varint(); got != -5 {
		t.Errorf("Varint = %d", got)
	}
	if got := d.Byte(); got != 0xab {
		t.Errorf("Byte = %#x", got)
	}
	if got := d.String(); got != "héllo" {
		t.Errorf("String = %q", got)
	}
	p := d.Bytes()
	if !bytes.Equal(p, []byte{1, 2, 3}) || cap(p) != 3 {
		t.Errorf("Bytes = %v (cap %d), want [1 2 3] (cap 3)", p, cap(p))
	}
	if got := d.String(); got != "" {
		t.Errorf("empty String = %q", got)
	}
	if d.Err() != nil || string(d.Rest()) != "tail" {
		t.Errorf("after all fields: err %v, rest %q", d.Err(), d.Rest())
	}
}

// The first error sticks: later reads return zero values and leave the
// rest unread, whatever follows.
func TestErrorSticks(t *testing.T) {
	for name, read := range map[string]func(*Decoder){
		"Uvarint":       func(d *Decoder) { d.Uvarint() },
		"Byte":          func(d *Decoder) { d.Byte() },
		"String":        func(d *Decoder) { _ = d.String() },
		"Bytes":         func(d *Decoder) { d.Bytes() },
		"Fail":          func(d *Decoder) { d.Fail() },
		"long String":   func(d *Decoder) { d.b = []byte{9, 'a'}; _ = d.String() },
		"long Bytes":    func(d *Decoder) { d.b = []byte{9, 'a'}; d.Bytes() },
		"cut Uvarint":   func(d *Decoder) { d.b = []byte{0x80}; d.Uvarint() },
		"overlong uvar": func(d *Decoder) { d.b = bytes.Repeat([]byte{0xff}, 11); d.Uvarint() },
	} {
		d := NewDecoder(nil, errBad)
		read(&d)
		if d.Err() != errBad {
			t.Errorf("%s: err = %v, want %v", name, d.Err(), errBad)
			continue
		}
		d.b = AppendString([]byte{7, 7}, "x")
		if d.Uvarint() != 0 || d.Byte() != 0 || d.String() != "" || d.Bytes() != nil || d.Varint() != 0 {
			t.Errorf("%s: a read after the error returned a value", name)
		}
		if d.Err() != errBad || len(d.Rest()) != 4 {
			t.Errorf("%s: after the error: err %v, rest %v", name, d.Err(), d.Rest())
		}
	}
}

func TestLen(t *testing.T) {
	for _, x := range []uint64{0, 1, 127, 128, 1<<14 - 1, 1 << 14, 1 << 40, math.MaxUint64} {
		if got, want := UvarintLen(x), len(binary.AppendUvarint(nil, x)); got != want {
			t.Errorf("UvarintLen(%d) = %d, want %d", x, got, want)
		}
	}
	s := string(bytes.Repeat([]byte("v"), 300))
	if got, want := StringLen(s), len(AppendString(nil, s)); got != want {
		t.Errorf("StringLen(300 bytes) = %d, want %d", got, want)
	}
}

// FuzzDecoder reads arbitrary bytes as strings until an error: no panic,
// and what was read encodes to bytes that read back the same strings (not
// always the same bytes: a varint may have been written longer than it
// needs).
func FuzzDecoder(f *testing.F) {
	f.Add(AppendString(AppendString(nil, "a"), "bc"))
	f.Add([]byte{0xff, 0xff, 0xff})
	f.Add([]byte{0x81, 0x00, 'a'})
	f.Fuzz(func(t *testing.T, b []byte) {
		read := readStrings(b)
		var again []byte
		for _, s := range read {
			again = AppendString(again, s)
		}
		if got := readStrings(again); len(got) != len(read) {
			t.Fatalf("read %q, then %q from its encoding", read, got)
		} else {
			for i := range got {
				if got[i] != read[i] {
					t.Fatalf("read %q, then %q from its encoding", read, got)
				}
			}
		}
	})
}

func readStrings(b []byte) []string {
	d := NewDecoder(b, errBad)
	var out []string
	for len(d.Rest()) > 0 {
		s := d.String()
		if d.Err() != nil {
			break
		}
		out = append(out, s)
	}
	return out
}

// A length-prefixed field may end the input exactly: its length equal to
// what is left is not too long.
func TestFieldEndsInput(t *testing.T) {
	d := NewDecoder(AppendBytes(nil, []byte("abc")), errBad)
	if got := d.Bytes(); string(got) != "abc" || d.Err() != nil || len(d.Rest()) != 0 {
		t.Errorf("Bytes at the end = %q, err %v, rest %q; want abc, nil, empty", got, d.Err(), d.Rest())
	}
	d = NewDecoder(AppendString(nil, "abc"), errBad)
	if got := d.String(); got != "abc" || d.Err() != nil || len(d.Rest()) != 0 {
		t.Errorf("String at the end = %q, err %v, rest %q; want abc, nil, empty", got, d.Err(), d.Rest())
	}
}
