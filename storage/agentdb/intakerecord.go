package agentdb

import (
	"encoding/binary"
	"errors"
	"time"

	"github.com/calltap/calltap/storage/intake"
	"github.com/calltap/calltap/storage/varfield"
)

// The intake log's payloads (the frames are storage/intake's): a byte
// for the kind, then a capture's fields in a fixed order, in varfield's
// layout (strings and bytes length-prefixed, numbers as varints, times
// as unix µs with 0 for none, booleans as a byte):
//
//	insert (1): id, relay id, source, created at, arrived at, queued,
//	  method, path, query, request headers, body size, body file, body
//	  offset, then the body itself when no file holds it, target, event,
//	  call id, delivery id, occurred at, duplicate of, replay of, status,
//	  max attempts, route (encodeInsert; a log written before routes
//	  ends at max attempts, and is read with no route)
//	update (2): id, status, response status, response headers, has a
//	  response body, response body, error, duration, delivered at,
//	  attempts, max attempts, target, queued, arrived at, has an
//	  attempt, then the attempt's n, at, response status, error and
//	  duration (encodeUpdate)

// Kinds of record.
const (
	recInsert byte = 1
	recUpdate byte = 2
)

// batchSize is about the bytes of the frames of inserts and updates.
func batchSize(inserts, updates []*Capture) int {
	n := 0
	for _, c := range inserts {
		n += 512 + len(c.RequestHeaders) + len(c.Path) + len(c.Query)
		if !intake.KeptApart(len(c.Body)) {
			n += len(c.Body)
		}
	}
	for _, c := range updates {
		n += 256 + len(c.ResponseHeaders) + len(c.ResponseBody) + len(c.Error)
	}
	return n
}

// recEncoder writes a record's fields in varfield's layout: strings and
// bytes length-prefixed, numbers as varints.
type recEncoder struct{ b []byte }

func (e *recEncoder) str(s string)   { e.b = varfield.AppendString(e.b, s) }
func (e *recEncoder) bytes(p []byte) { e.b = varfield.AppendBytes(e.b, p) }
func (e *recEncoder) int(n int64)    { e.b = binary.AppendVarint(e.b, n) }
func (e *recEncoder) bool(v bool)    { e.b = append(e.b, boolByte(v)) }
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
	e.str(c.Route)
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

// recDecoder reads what recEncoder wrote; the first error, errRecord,
// sticks.
type recDecoder struct{ varfield.Decoder }

var errRecord = errors.New("malformed record")

func (d *recDecoder) bool() bool { return d.Byte() == 1 }

func (d *recDecoder) time() time.Time {
	us := d.Varint()
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
	d := recDecoder{varfield.NewDecoder(rec[1:], errRecord)}
	c = &Capture{}
	switch rec[0] {
	case recInsert:
		c.ID = d.String()
		c.RelayID = d.String()
		c.Source = d.String()
		c.CreatedAt = d.time()
		c.ArrivedAt = d.time()
		c.Queued = d.bool()
		c.Method = d.String()
		c.Path = d.String()
		c.Query = d.String()
		c.RequestHeaders = d.String()
		c.Size = int(d.Varint())
		c.bodyFile = d.String()
		c.bodyOffset = d.Varint()
		if c.bodyFile == "" {
			c.Body = d.Bytes()
			bodyAt = len(rec) - len(d.Rest()) - len(c.Body)
		}
		c.Target = d.String()
		c.Event = d.String()
		c.CallID = d.String()
		c.DeliveryID = d.String()
		c.OccurredAt = d.String()
		c.DuplicateOf = d.String()
		c.ReplayOf = d.String()
		c.Status = d.String()
		c.MaxAttempts = int(d.Varint())
		if len(d.Rest()) > 0 {
			c.Route = d.String()
		}
	case recUpdate:
		c.ID = d.String()
		c.Status = d.String()
		c.ResponseStatus = int(d.Varint())
		c.ResponseHeaders = d.String()
		hasBody := d.bool()
		body := d.Bytes()
		if hasBody {
			c.ResponseBody = body
		}
		c.Error = d.String()
		c.Duration = time.Duration(d.Varint())
		c.DeliveredAt = d.time()
		c.Attempts = int(d.Varint())
		c.MaxAttempts = int(d.Varint())
		c.Target = d.String()
		c.Queued = d.bool()
		c.ArrivedAt = d.time()
		if d.bool() {
			c.LastAttempt = &Attempt{N: int(d.Varint()), At: d.time(), ResponseStatus: int(d.Varint()), Error: d.String(), Duration: time.Duration(d.Varint())}
		}
	default:
		return 0, nil, 0, errRecord
	}
	if d.Err() == nil && len(d.Rest()) != 0 {
		d.Fail()
	}
	if d.Err() != nil {
		return 0, nil, 0, d.Err()
	}
	return rec[0], c, bodyAt, nil
}
