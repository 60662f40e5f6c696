package storage

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"time"
)

// The intake log's records (intake.go): a frame's layout, and a
// capture's fields in it.

// Kinds of record.
const (
	recInsert byte = 1
	recUpdate byte = 2
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// appendFrame appends to b a frame whose payload encode appends, and
// returns b and the payload (a slice of b).
func appendFrame(b []byte, encode func([]byte) []byte) (_, payload []byte) {
	at := len(b)
	b = append(b, 0, 0, 0, 0, 0, 0, 0, 0)
	b = encode(b)
	payload = b[at+8:]
	binary.LittleEndian.PutUint32(b[at:], uint32(len(payload)))
	binary.LittleEndian.PutUint32(b[at+4:], crc32.Checksum(payload, castagnoli))
	return b, payload
}

// batchSize is about the bytes of the frames of inserts and updates.
func batchSize(inserts, updates []*Capture) int {
	n := 0
	for _, c := range inserts {
		n += 512 + len(c.RequestHeaders) + len(c.Path) + len(c.Query)
		if !KeptApart(len(c.Body)) {
			n += len(c.Body)
		}
	}
	for _, c := range updates {
		n += 256 + len(c.ResponseHeaders) + len(c.ResponseBody) + len(c.Error)
	}
	return n
}

// recEncoder writes a record's fields: strings and bytes length-prefixed,
// numbers as varints.
type recEncoder struct{ b []byte }

func (e *recEncoder) str(s string) {
	e.b = binary.AppendUvarint(e.b, uint64(len(s)))
	e.b = append(e.b, s...)
}
func (e *recEncoder) bytes(p []byte) {
	e.b = binary.AppendUvarint(e.b, uint64(len(p)))
	e.b = append(e.b, p...)
}
func (e *recEncoder) int(n int64) { e.b = binary.AppendVarint(e.b, n) }
func (e *recEncoder) bool(v bool) { e.b = append(e.b, boolByte(v)) }
func (e *recEncoder) time(t time.Time) {
	if t.IsZero() {
		e.int(0)
		return
	}
	e.int(t.UnixMicro())
}

func boolByte(v bool) byte {
	if v {
		return 1
	}
	return 0
}

// encodeInsert appends to b the record of a new capture, dup its duplicate.
func encodeInsert(b []byte, c *Capture, dup string) []byte {
	e := recEncoder{b: b}
	e.b = append(e.b, recInsert)
	e.str(c.ID)
	e.str(c.RelayID)
	e.str(c.Source)
	e.time(c.CreatedAt)
	e.time(c.ArrivedAt)
	e.bool(c.Queued)
	e.str(c.Method)
	e.str(c.Path)
	e.str(c.Query)
	e.str(c.RequestHeaders)
	e.int(int64(len(c.Body)))
	e.str(c.bodyFile)
	e.int(c.bodyOffset)
	if c.bodyFile == "" {
		e.bytes(c.Body)
	}
	e.str(c.Target)
	e.str(c.Event)
	e.str(c.CallID)
	e.str(c.DeliveryID)
	e.str(c.OccurredAt)
	e.str(dup)
	e.str(c.ReplayOf)
	e.str(c.Status)
	e.int(int64(c.MaxAttempts))
	return e.b
}

// encodeUpdate appends to b the record of a capture's response
// (updateCapture).
func encodeUpdate(b []byte, c *Capture) []byte {
	e := recEncoder{b: b}
	e.b = append(e.b, recUpdate)
	e.str(c.ID)
	e.str(c.Status)
	e.int(int64(c.ResponseStatus))
	e.str(c.ResponseHeaders)
	e.bool(c.ResponseBody != nil)
	e.bytes(c.ResponseBody)
	e.str(c.Error)
	e.int(int64(c.Duration))
	e.time(c.DeliveredAt)
	e.int(int64(c.Attempts))
	e.int(int64(c.MaxAttempts))
	e.str(c.Target)
	e.bool(c.Queued)
	e.time(c.ArrivedAt)
	e.bool(c.LastAttempt != nil)
	if a := c.LastAttempt; a != nil {
		e.int(int64(a.N))
		e.time(a.At)
		e.int(int64(a.ResponseStatus))
		e.str(a.Error)
		e.int(int64(a.Duration))
	}
	return e.b
}

// recDecoder reads what recEncoder wrote; the first error sticks.
type recDecoder struct {
	b   []byte
	err error
}

var errRecord = errors.New("malformed record")

func (d *recDecoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errRecord
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *recDecoder) bytes() []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.err = errRecord
		return nil
	}
	p := d.b[:n:n]
	d.b = d.b[n:]
	return p
}

func (d *recDecoder) str() string { return string(d.bytes()) }

// int reads what binary.AppendVarint wrote: a zigzag-encoded uvarint.
func (d *recDecoder) int() int64 {
	u := d.uvarint()
	return int64(u>>1) ^ -int64(u&1)
}

func (d *recDecoder) bool() bool {
	if d.err != nil || len(d.b) == 0 {
		d.err = errRecord
		return false
	}
	v := d.b[0] == 1
	d.b = d.b[1:]
	return v
}

func (d *recDecoder) time() time.Time {
	us := d.int()
	if us == 0 {
		return time.Time{}
	}
	return time.UnixMicro(us).UTC()
}

// decodeRecord reads a record's kind and capture, and where in rec an
// insert's inline body begins.
func decodeRecord(rec []byte) (kind byte, c *Capture, bodyAt int, err error) {
	if len(rec) == 0 {
		return 0, nil, 0, errRecord
	}
	d := recDecoder{b: rec[1:]}
	c = &Capture{}
	switch rec[0] {
	case recInsert:
		c.ID = d.str()
		c.RelayID = d.str()
		c.Source = d.str()
		c.CreatedAt = d.time()
		c.ArrivedAt = d.time()
		c.Queued = d.bool()
		c.Method = d.str()
		c.Path = d.str()
		c.Query = d.str()
		c.RequestHeaders = d.str()
		c.Size = int(d.int())
		c.bodyFile = d.str()
		c.bodyOffset = d.int()
		if c.bodyFile == "" {
			c.Body = d.bytes()
			bodyAt = len(rec) - len(d.b) - len(c.Body)
		}
		c.Target = d.str()
		c.Event = d.str()
		c.CallID = d.str()
		c.DeliveryID = d.str()
		c.OccurredAt = d.str()
		c.DuplicateOf = d.str()
		c.ReplayOf = d.str()
		c.Status = d.str()
		c.MaxAttempts = int(d.int())
	case recUpdate:
		c.ID = d.str()
		c.Status = d.str()
		c.ResponseStatus = int(d.int())
		c.ResponseHeaders = d.str()
		hasBody := d.bool()
		body := d.bytes()
		if hasBody {
			c.ResponseBody = body
		}
		c.Error = d.str()
		c.Duration = time.Duration(d.int())
		c.DeliveredAt = d.time()
		c.Attempts = int(d.int())
		c.MaxAttempts = int(d.int())
		c.Target = d.str()
		c.Queued = d.bool()
		c.ArrivedAt = d.time()
		if d.bool() {
			c.LastAttempt = &Attempt{N: int(d.int()), At: d.time(), ResponseStatus: int(d.int()), Error: d.str(), Duration: time.Duration(d.int())}
		}
	default:
		return 0, nil, 0, errRecord
	}
	if d.err == nil && len(d.b) != 0 {
		d.err = errRecord
	}
	if d.err != nil {
		return 0, nil, 0, d.err
	}
	return rec[0], c, bodyAt, nil
}
