// Package varfield reads and writes the byte layout shared by the relay's
// wire frames (relay/protocol.go) and the agent's intake log records
// (storage/intakerecord.go): a run of fields with no names and no tags,
// each read back in the order it was written.
//
// The fields are:
//   - an unsigned number: a varint as encoding/binary's AppendUvarint
//     writes it and Uvarint reads it (1 to 10 bytes);
//   - a signed number: encoding/binary's AppendVarint (zigzag, then as
//     unsigned);
//   - a byte: itself;
//   - a string or byte slice: its length as an unsigned number, then that
//     many bytes.
//
// A Decoder reads fields until one does not parse; that error sticks, and
// every later read returns a zero value, so a caller reads all its fields
// and checks Err once. The error is the caller's own (each caller has its
// sentinel), given to NewDecoder.
package varfield

import "encoding/binary"

// AppendString appends s, length-prefixed, to b.
func AppendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// AppendBytes appends p, length-prefixed, to b.
func AppendBytes(b, p []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(p)))
	return append(b, p...)
}

// UvarintLen is len(binary.AppendUvarint(nil, x)), without encoding it.
func UvarintLen(x uint64) int {
	n := 1
	for ; x >= 0x80; x >>= 7 {
		n++
	}
	return n
}

// StringLen is len(AppendString(nil, s)), without encoding it.
func StringLen(s string) int { return UvarintLen(uint64(len(s))) + len(s) }

// Decoder reads fields from the front of a byte slice.
type Decoder struct {
	b         []byte // what is left to read
	err       error  // the first error, or nil
	malformed error  // what err becomes when a field does not parse
}

// NewDecoder reads b; a field that does not parse makes Err malformed.
func NewDecoder(b []byte, malformed error) Decoder {
	return Decoder{b: b, malformed: malformed}
}

// Err is the first error, or nil.
func (d *Decoder) Err() error { return d.err }

// Fail makes Err the decoder's malformed error, for a field that parsed
// but that the caller finds wrong.
func (d *Decoder) Fail() { d.err = d.malformed }

// Rest is what is left to read. It aliases the decoder's input.
func (d *Decoder) Rest() []byte { return d.b }

// Uvarint reads an unsigned number.
func (d *Decoder) Uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = d.malformed
		return 0
	}
	d.b = d.b[n:]
	return v
}

// Varint reads a signed number: the zigzag uvarint binary.AppendVarint
// writes.
func (d *Decoder) Varint() int64 {
	u := d.Uvarint()
	return int64(u>>1) ^ -int64(u&1)
}

// Byte reads one byte.
func (d *Decoder) Byte() byte {
	if d.err != nil || len(d.b) == 0 {
		d.err = d.malformed
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

// Bytes reads a length-prefixed byte slice. It aliases the decoder's
// input, with its capacity cut to its length so that an append to it
// cannot overwrite the next field.
func (d *Decoder) Bytes() []byte {
	n := d.Uvarint()
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.err = d.malformed
		return nil
	}
	p := d.b[:n:n]
	d.b = d.b[n:]
	return p
}

// String reads a length-prefixed string (a copy).
func (d *Decoder) String() string {
	n := d.Uvarint()
	if d.err != nil {
		return ""
	}
	if n > uint64(len(d.b)) {
		d.err = d.malformed
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}
