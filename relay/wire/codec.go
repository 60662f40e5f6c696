package wire

import (
	"encoding/binary"
	"encoding/json"
	"fmt"

	"github.com/calltap/calltap/storage/varfield"
)

// Encoders append a frame to b and return it; a frame that carries a body
// is encoded up to it (the Head functions), and the body is written after
// it in the same websocket message, never copied. Decoders take one whole
// frame, type byte included; a body they return aliases the frame.

// Limits are what the relay of one connection takes from the agent, as its
// Hello announced them. Zero fields are not limited.
type Limits struct {
	MaxBody  int64 // largest body of an answer
	MaxFrame int64 // largest frame, head and body together
}

// Limits reads the limits h announces. A relay that announces no frame
// limit reads MaxBody plus the 1 MiB of room its default gives.
func (h *Hello) Limits() Limits {
	l := Limits{MaxBody: h.MaxBody, MaxFrame: h.MaxFrame}
	if l.MaxFrame <= 0 && l.MaxBody > 0 {
		l.MaxFrame = l.MaxBody + 1<<20
	}
	return l
}

// Check returns why r cannot be sent to the relay under l, naming the
// limit, or nil when it fits.
func (l Limits) Check(r *Response) error {
	if l.MaxBody > 0 && int64(len(r.Body)) > l.MaxBody {
		return fmt.Errorf("the handler's answer is larger than the relay's limit of %d bytes", l.MaxBody)
	}
	if l.MaxFrame > 0 && int64(responseHeadLen(r)+len(r.Body)) > l.MaxFrame {
		return fmt.Errorf("the handler's answer with its headers is larger than the relay's limit of %d bytes per frame", l.MaxFrame)
	}
	return nil
}

// AppendHeader encodes h as frames carry it ("headers": a count, then
// name and value strings); the relay's offline queue keeps headers so.
func AppendHeader(b []byte, h Header) []byte {
	b = binary.AppendUvarint(b, uint64(len(h)))
	for _, f := range h {
		b = varfield.AppendString(b, f.Name)
		b = varfield.AppendString(b, f.Value)
	}
	return b
}

// AppendHello encodes a Hello frame.
func AppendHello(b []byte, h *Hello) []byte { return appendJSON(b, FrameHello, h) }

// AppendNotice encodes a Notice frame.
func AppendNotice(b []byte, n Notice) []byte { return appendJSON(b, FrameNotice, n) }

// AppendRequestHead encodes a Request frame up to its body.
func AppendRequestHead(b []byte, r *Request) []byte {
	b = append(b, FrameRequest)
	b = binary.AppendUvarint(b, r.Stream)
	var flags uint64
	if r.Queued {
		flags |= requestFlagQueued
	}
	b = binary.AppendUvarint(b, flags)
	b = binary.AppendUvarint(b, uint64(r.ArrivedAt))
	b = varfield.AppendString(b, r.ID)
	b = varfield.AppendString(b, r.Method)
	b = varfield.AppendString(b, r.URI)
	return AppendHeader(b, r.Header)
}

// AppendResponseHead encodes a Response frame up to its body.
func AppendResponseHead(b []byte, r *Response) []byte {
	b = append(b, FrameResponse)
	b = binary.AppendUvarint(b, r.Stream)
	b = binary.AppendUvarint(b, uint64(r.Status))
	b = append(b, byte(r.Result))
	b = varfield.AppendString(b, r.Error)
	return AppendHeader(b, r.Header)
}

// responseHeadLen is len(AppendResponseHead(nil, r)), without encoding it.
func responseHeadLen(r *Response) int {
	n := 1 + varfield.UvarintLen(r.Stream) + varfield.UvarintLen(uint64(r.Status)) + 1 + varfield.StringLen(r.Error) + varfield.UvarintLen(uint64(len(r.Header)))
	for _, f := range r.Header {
		n += varfield.StringLen(f.Name) + varfield.StringLen(f.Value)
	}
	return n
}

// AppendAck encodes an Ack frame.
func AppendAck(b []byte, a Ack) []byte {
	b = append(b, FrameAck)
	return binary.AppendUvarint(b, a.Stream)
}

// AppendGoAway encodes a GoAway frame.
func AppendGoAway(b []byte, g GoAway) []byte {
	b = append(b, FrameGoAway, byte(g.Reason))
	return varfield.AppendString(b, g.Message)
}

// AppendLeave encodes a Leave frame.
func AppendLeave(b []byte, _ Leave) []byte { return append(b, FrameLeave) }

func appendJSON(b []byte, typ byte, v any) []byte {
	j, err := json.Marshal(v)
	if err != nil {
		panic(err) // only our own plain structs are marshalled
	}
	return append(append(b, typ), j...)
}

// decoder reads the fields of one frame (varfield's layout); the first
// error, ErrMalformed, sticks.
type decoder struct{ varfield.Decoder }

func newDecoder(b []byte) decoder { return decoder{varfield.NewDecoder(b, ErrMalformed)} }

func (d *decoder) header() Header {
	n := d.Uvarint()
	if d.Err() != nil {
		return nil
	}
	// Each field takes at least two bytes, which bounds a hostile count.
	if n > uint64(len(d.Rest()))/2 {
		d.Fail()
		return nil
	}
	h := make(Header, 0, n)
	for i := uint64(0); i < n && d.Err() == nil; i++ {
		name := d.String()
		value := d.String()
		h = append(h, HeaderField{name, value})
	}
	return h
}

// DecodeHeader parses what AppendHeader wrote at the start of b.
func DecodeHeader(b []byte) (Header, error) {
	d := newDecoder(b)
	h := d.header()
	return h, d.Err()
}

// DecodeHello parses a Hello frame into h.
func DecodeHello(b []byte, h *Hello) error { return decodeJSON(b, FrameHello, h) }

// DecodeNotice parses a Notice frame into n.
func DecodeNotice(b []byte, n *Notice) error { return decodeJSON(b, FrameNotice, n) }

// DecodeRequest parses a Request frame. Body aliases b: the caller must
// not reuse b while the request is alive.
func DecodeRequest(b []byte) (*Request, error) {
	d := newDecoder(b)
	if d.Byte() != FrameRequest {
		return nil, ErrMalformed
	}
	r := &Request{}
	r.Stream = d.Uvarint()
	flags := d.Uvarint()
	r.Queued = flags&requestFlagQueued != 0
	r.ArrivedAt = int64(d.Uvarint())
	r.ID = d.String()
	r.Method = d.String()
	r.URI = d.String()
	r.Header = d.header()
	if d.Err() != nil {
		return nil, d.Err()
	}
	if r.Method == "" || len(r.URI) == 0 || r.URI[0] != '/' {
		return nil, ErrMalformed
	}
	r.Body = d.Rest()
	return r, nil
}

// DecodeResponse parses a Response frame. Body aliases b.
func DecodeResponse(b []byte) (*Response, error) {
	d := newDecoder(b)
	if d.Byte() != FrameResponse {
		return nil, ErrMalformed
	}
	r := &Response{}
	r.Stream = d.Uvarint()
	status := d.Uvarint()
	r.Result = Result(d.Byte())
	r.Error = d.String()
	r.Header = d.header()
	if d.Err() != nil {
		return nil, d.Err()
	}
	if r.Result == ResultOK && (status < 100 || status > 999) {
		return nil, ErrMalformed
	}
	if r.Result > ResultQueued {
		return nil, ErrMalformed
	}
	r.Status = int(status)
	r.Body = d.Rest()
	return r, nil
}

// DecodeAck parses an Ack frame.
func DecodeAck(b []byte) (Ack, error) {
	d := newDecoder(b)
	if d.Byte() != FrameAck {
		return Ack{}, ErrMalformed
	}
	s := d.Uvarint()
	if d.Err() != nil || len(d.Rest()) != 0 {
		return Ack{}, ErrMalformed
	}
	return Ack{Stream: s}, nil
}

// DecodeGoAway parses a GoAway frame.
func DecodeGoAway(b []byte) (GoAway, error) {
	d := newDecoder(b)
	if d.Byte() != FrameGoAway {
		return GoAway{}, ErrMalformed
	}
	g := GoAway{Reason: GoAwayReason(d.Byte()), Message: d.String()}
	return g, d.Err()
}

func decodeJSON(b []byte, typ byte, v any) error {
	if len(b) == 0 || b[0] != typ {
		return ErrMalformed
	}
	if err := json.Unmarshal(b[1:], v); err != nil {
		return fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	return nil
}

// AppendForward encodes req, body included, for another node.
func AppendForward(b []byte, req *Request) []byte {
	return append(AppendRequestHead(b, req), req.Body...)
}

// DecodeForward parses what AppendForward wrote. Body aliases b.
func DecodeForward(b []byte) (*Request, error) { return DecodeRequest(b) }

// AppendAnswer encodes a node's answer, body included.
func AppendAnswer(b []byte, a *Answer) []byte {
	return append(AppendResponseHead(b, &Response{Status: a.Status, Header: a.Header}), a.Body...)
}

// DecodeAnswer parses what AppendAnswer wrote. Body aliases b.
func DecodeAnswer(b []byte) (*Answer, error) {
	r, err := DecodeResponse(b)
	if err != nil {
		return nil, err
	}
	if r.Result != ResultOK {
		return nil, ErrMalformed
	}
	return &Answer{Status: r.Status, Header: r.Header, Body: r.Body}, nil
}
