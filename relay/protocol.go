package relay

// The wire protocol between the relay and an agent.
//
// Flow:
//
//	agent                                   relay
//	  | -- GET /_calltap/connect (upgrade) --> |  Authorization: Bearer <token>
//	  |    Sec-WebSocket-Protocol: calltap.v1  |  Calltap-Require-Header: <name: value> (0..n)
//	  |                                        |  Calltap-Max-Frame: <agent's read limit>
//	  | <---------------- hello -------------- |  tunnel id, public URL, limits
//	  |                                        |
//	  | <-------------- request -------------- |  a sender hit /t/<tunnel>/...; or a queued one
//	  |  (agent saves it in SQLite)            |
//	  | ---------------- ack ----------------> |  saved: the relay may now forget a queued one
//	  |                                        |  (live: left out when the response follows at once)
//	  |  (agent forwards it to the handler)    |
//	  | --------------- response ------------> |  status, headers, body (live requests only),
//	  |                                        |  or "queued" (ResultQueued, below)
//	  |                                        |
//	  | <-------------- notice --------------- |  counters the agent's console shows
//	  | <-------------- goaway --------------- |  why the relay is closing this connection
//	  |                                        |
//	  | ---------------- leave --------------> |  the agent is stopping: send no more requests
//	  | <--------- goaway (reason 4) --------- |  none follows; answers in flight still go back
//
// Each frame is exactly one binary websocket message, so a request costs one
// message each way (plus the ack, for a queued request or a slow handler).
// Frames written together leave in one system call (batchConn). Keepalive
// uses websocket ping/pong control
// frames. Many requests are in flight at once; stream ids tie the frames of
// one request together and are chosen by the relay, unique per connection.
//
// Every frame begins with one type byte. Integers are unsigned varints
// (encoding/binary's Uvarint) unless stated; a "string" is a varint length
// followed by that many bytes; "headers" is a varint count followed by that
// many (name string, value string) pairs in the order they arrived, so
// repeated headers and their order survive. storage/varfield reads and
// writes these fields.
//
//	hello    = 0x01 json(Hello)
//	request  = 0x02 stream flags arrivedAt(µs) id:string method:string uri:string headers body...
//	           flags: bit 0 set for a request from the offline queue
//	ack      = 0x03 stream
//	response = 0x04 stream status result:byte error:string headers body...
//	           result (Result): 0 ok, 1 unreachable, 2 timeout, 3 too large,
//	           4 queued; status, headers and body mean something only with 0
//	notice   = 0x05 json(Notice)
//	goaway   = 0x06 reason:byte message:string
//	leave    = 0x07
//
// An agent that stops sends leave (to a relay whose hello has leave set),
// then answers what it holds: the relay queues new requests from the
// moment it reads leave, sends no request after its goaway "left", and
// keeps the connection open until the agent closes it.
//
// The agent hands requests to its handler one at a time, in arrival order,
// while any it got from the offline queue (or saved but did not send before
// it last stopped) are still waiting; a live request arriving then waits
// its turn. One that would still be waiting when the relay's forward
// timeout (Hello.ForwardTimeoutMS) runs out is answered with result 4,
// "queued", once saved: the relay answers its sender 202 as for a request
// it queued itself, and the agent delivers it later, in order. An agent
// sends result 4 only to a relay whose hello gives its forward timeout.
//
// The body is the rest of the frame: it is never length-prefixed, so it is
// written straight after the header bytes without being copied into a new
// buffer. Each end reads frames up to its own limit (websocket read limit)
// and tells the other: the agent in its handshake (Calltap-Max-Frame), the
// relay in its hello (max_frame, with max_body, the largest body it takes
// either way). A frame the peer would not read is never written: a
// connection's frames share one websocket, and an oversized one would close
// it under every request in flight.

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"unicode/utf8"

	"github.com/calltap/calltap/storage/varfield"
)

// Subprotocol is the websocket subprotocol; its suffix is the protocol
// version. A relay refuses an agent that does not offer it.
const Subprotocol = "calltap.v1"

// ConnectPath is where agents open their websocket.
const ConnectPath = "/_calltap/connect"

// RequireHeaderHeader carries, in the agent's handshake, a header every
// sender must present (calltap listen --require-header).
const RequireHeaderHeader = "Calltap-Require-Header"

// MaxFrameHeader carries, in the agent's handshake, the largest frame the
// agent reads (its websocket read limit): the relay sends nothing larger.
const MaxFrameHeader = "Calltap-Max-Frame"

// Frame types.
const (
	frameHello    byte = 0x01
	frameRequest  byte = 0x02
	frameAck      byte = 0x03
	frameResponse byte = 0x04
	frameNotice   byte = 0x05
	frameGoAway   byte = 0x06
	frameLeave    byte = 0x07
)

// DefaultMaxFrame bounds one frame: the default body limit (10 MiB) plus room
// for headers.
const DefaultMaxFrame = 10<<20 + 1<<20

// Header is an ordered list of header fields. Unlike a map it keeps repeats
// and their order, which is what the sender sent.
type Header []HeaderField

// HeaderField is one header line.
type HeaderField struct {
	Name  string
	Value string
}

// MarshalJSON renders a Header as [[name, value], ...]. A name or value
// that is not UTF-8 (a sender may put any byte but a control in a value)
// goes as [name, value, "base64"] with both in base64, so that every byte
// comes back: JSON would turn it into U+FFFD.
func (h Header) MarshalJSON() ([]byte, error) {
	fields := make([][]string, len(h))
	for i, f := range h {
		if utf8.ValidString(f.Name) && utf8.ValidString(f.Value) {
			fields[i] = []string{f.Name, f.Value}
			continue
		}
		fields[i] = []string{base64.StdEncoding.EncodeToString([]byte(f.Name)), base64.StdEncoding.EncodeToString([]byte(f.Value)), "base64"}
	}
	return json.Marshal(fields)
}

// UnmarshalJSON reads [[name, value], ...], with [name, value, "base64"]
// for a field in base64.
func (h *Header) UnmarshalJSON(b []byte) error {
	var fields [][]string
	if err := json.Unmarshal(b, &fields); err != nil {
		return err
	}
	out := make(Header, len(fields))
	for i, f := range fields {
		switch {
		case len(f) == 2:
			out[i] = HeaderField{f[0], f[1]}
		case len(f) == 3 && f[2] == "base64":
			name, err := base64.StdEncoding.DecodeString(f[0])
			if err != nil {
				return fmt.Errorf("header %d: name: %w", i+1, err)
			}
			value, err := base64.StdEncoding.DecodeString(f[1])
			if err != nil {
				return fmt.Errorf("header %d: value: %w", i+1, err)
			}
			out[i] = HeaderField{string(name), string(value)}
		default:
			return fmt.Errorf("header %d: want [name, value] or [name, value, \"base64\"]", i+1)
		}
	}
	*h = out
	return nil
}

// Get returns the first value of name (case-insensitive).
func (h Header) Get(name string) string {
	for _, f := range h {
		if http.CanonicalHeaderKey(f.Name) == http.CanonicalHeaderKey(name) {
			return f.Value
		}
	}
	return ""
}

// HeaderFrom flattens an http.Header. Go's server has already merged the
// wire order into per-name slices; names come out in the order Go keeps
// (sorted) with each name's values in arrival order.
func HeaderFrom(hh http.Header, host string) Header {
	out := make(Header, 0, len(hh)+1)
	if host != "" {
		out = append(out, HeaderField{"Host", host})
	}
	for _, name := range sortedKeys(hh) {
		for _, v := range hh[name] {
			out = append(out, HeaderField{name, v})
		}
	}
	return out
}

// Apply adds every field to hh, keeping repeats.
func (h Header) Apply(hh http.Header) {
	for _, f := range h {
		hh.Add(f.Name, f.Value)
	}
}

// Hello is the relay's first frame on a new agent connection.
type Hello struct {
	TunnelID  string `json:"tunnel_id"`
	Name      string `json:"name"`       // the token's name
	PublicURL string `json:"public_url"` // where senders reach this tunnel
	MaxBody   int64  `json:"max_body"`   // largest body the relay takes, in requests and in answers
	MaxFrame  int64  `json:"max_frame"`  // largest frame the relay reads; 0 from a relay older than ResultTooLarge
	Queued    int    `json:"queued"`     // requests waiting in the offline queue
	Version   string `json:"version"`
	// ForwardTimeoutMS is how long the relay waits for a live request's
	// response before answering its sender 504. A relay that sends it
	// understands ResultQueued; an older one leaves it out.
	ForwardTimeoutMS int64 `json:"forward_timeout_ms,omitempty"`
	// Leave: the relay reads the leave frame of an agent that stops.
	Leave bool `json:"leave,omitempty"`
}

// Notice carries counters for the agent's console; sent when they change.
type Notice struct {
	Rejected int64 `json:"rejected"` // senders refused by --require-header
	Queued   int   `json:"queued"`   // requests still in the offline queue
}

// Request is one request of a sender, as the relay hands it to the agent.
type Request struct {
	Stream    uint64
	Queued    bool   // from the offline queue: the relay answered 202 already
	ArrivedAt int64  // unix µs when it reached the relay
	ID        string // the relay's id of the request (stable across redelivery)
	Method    string
	URI       string // path after /t/<tunnel> plus "?query"
	Header    Header
	Body      []byte
}

const requestFlagQueued = 1 << 0

// Response is the local handler's answer, or why there is none.
type Response struct {
	Stream uint64
	Status int
	Result Result
	Error  string
	Header Header
	Body   []byte
}

// Result says whether the local handler answered.
type Result byte

const (
	ResultOK          Result = 0 // Status, Header and Body are the handler's
	ResultUnreachable Result = 1 // refused, reset, DNS: the relay answers 502
	ResultTimeout     Result = 2 // slower than the forward timeout: 504
	ResultTooLarge    Result = 3 // the answer exceeds the relay's limits (Error says which): 502
	// ResultQueued: saved, but requests that arrived before it hold the
	// handler past the relay's forward timeout; the agent delivers it after
	// them and the relay answers its sender 202, as for a queued request.
	ResultQueued Result = 4
)

// Limits are what the relay of one connection takes from the agent, as its
// hello announced them. Zero fields are not limited.
type Limits struct {
	MaxBody  int64 // largest body of an answer
	MaxFrame int64 // largest frame, head and body together
}

// limitsOf reads the limits a hello announces. A relay that announces no
// frame limit reads MaxBody plus the 1 MiB of room its default gives.
func limitsOf(h *Hello) Limits {
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

// GoAway reasons.
type GoAwayReason byte

const (
	GoAwayShutdown GoAwayReason = 1 // relay shutting down: reconnect
	GoAwayReplaced GoAwayReason = 2 // a newer agent took the tunnel: exit
	GoAwayRevoked  GoAwayReason = 3 // the token was revoked: exit
	// GoAwayLeft answers the agent's leave: no request follows it, and
	// the connection stays open for the answers in flight.
	GoAwayLeft GoAwayReason = 4
)

// GoAway tells the agent why its connection is being closed.
type GoAway struct {
	Reason  GoAwayReason
	Message string
}

var errFrameTooLarge = errors.New("relay: frame exceeds the maximum size")

// errMalformed is returned for any frame that does not parse.
var errMalformed = errors.New("relay: malformed frame")

func appendHeader(b []byte, h Header) []byte {
	b = binary.AppendUvarint(b, uint64(len(h)))
	for _, f := range h {
		b = varfield.AppendString(b, f.Name)
		b = varfield.AppendString(b, f.Value)
	}
	return b
}

// appendRequestHead encodes a request frame up to its body.
func appendRequestHead(b []byte, r *Request) []byte {
	b = append(b, frameRequest)
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
	return appendHeader(b, r.Header)
}

// appendResponseHead encodes a response frame up to its body.
func appendResponseHead(b []byte, r *Response) []byte {
	b = append(b, frameResponse)
	b = binary.AppendUvarint(b, r.Stream)
	b = binary.AppendUvarint(b, uint64(r.Status))
	b = append(b, byte(r.Result))
	b = varfield.AppendString(b, r.Error)
	return appendHeader(b, r.Header)
}

// responseHeadLen is len(appendResponseHead(nil, r)), without encoding it.
func responseHeadLen(r *Response) int {
	n := 1 + varfield.UvarintLen(r.Stream) + varfield.UvarintLen(uint64(r.Status)) + 1 + varfield.StringLen(r.Error) + varfield.UvarintLen(uint64(len(r.Header)))
	for _, f := range r.Header {
		n += varfield.StringLen(f.Name) + varfield.StringLen(f.Value)
	}
	return n
}

func appendAck(b []byte, stream uint64) []byte {
	b = append(b, frameAck)
	return binary.AppendUvarint(b, stream)
}

func appendGoAway(b []byte, g GoAway) []byte {
	b = append(b, frameGoAway, byte(g.Reason))
	return varfield.AppendString(b, g.Message)
}

func appendJSON(b []byte, typ byte, v any) []byte {
	j, err := json.Marshal(v)
	if err != nil {
		panic(err) // only our own plain structs are marshalled
	}
	return append(append(b, typ), j...)
}

// decoder reads the fields of one frame (varfield's layout); the first
// error, errMalformed, sticks.
type decoder struct{ varfield.Decoder }

func newDecoder(b []byte) decoder { return decoder{varfield.NewDecoder(b, errMalformed)} }

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

// decodeRequest parses a request frame (type byte included). Body aliases
// b: the caller must not reuse b while the request is alive.
func decodeRequest(b []byte) (*Request, error) {
	d := newDecoder(b)
	if d.Byte() != frameRequest {
		return nil, errMalformed
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
		return nil, errMalformed
	}
	r.Body = d.Rest()
	return r, nil
}

// decodeResponse parses a response frame. Body aliases b.
func decodeResponse(b []byte) (*Response, error) {
	d := newDecoder(b)
	if d.Byte() != frameResponse {
		return nil, errMalformed
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
		return nil, errMalformed
	}
	if r.Result > ResultQueued {
		return nil, errMalformed
	}
	r.Status = int(status)
	r.Body = d.Rest()
	return r, nil
}

func decodeAck(b []byte) (uint64, error) {
	d := newDecoder(b)
	if d.Byte() != frameAck {
		return 0, errMalformed
	}
	s := d.Uvarint()
	if d.Err() != nil || len(d.Rest()) != 0 {
		return 0, errMalformed
	}
	return s, nil
}

func decodeGoAway(b []byte) (GoAway, error) {
	d := newDecoder(b)
	if d.Byte() != frameGoAway {
		return GoAway{}, errMalformed
	}
	g := GoAway{Reason: GoAwayReason(d.Byte()), Message: d.String()}
	return g, d.Err()
}

func decodeJSON(b []byte, typ byte, v any) error {
	if len(b) == 0 || b[0] != typ {
		return errMalformed
	}
	if err := json.Unmarshal(b[1:], v); err != nil {
		return fmt.Errorf("%w: %v", errMalformed, err)
	}
	return nil
}

// writeFrame writes head and then body as one websocket message through w.
func writeFrame(w io.WriteCloser, head, body []byte) error {
	if _, err := w.Write(head); err != nil {
		w.Close()
		return err
	}
	if len(body) > 0 {
		if _, err := w.Write(body); err != nil {
			w.Close()
			return err
		}
	}
	return w.Close()
}

// Between relay nodes (calltap relay --nats), a request taken by one node
// for a tunnel whose agent another holds crosses in one NATS request to
// that node (relay/cluster):
//
//	request data: a request frame as above, Stream 0 (AppendForward)
//	reply data:   a response frame, Stream 0, Result 0, carrying the
//	              status, headers and body the sender is to get (AppendAnswer)
//
// A body too large for one NATS message is left out of the frame and
// travels in chunks through the CALLTAP_BODIES stream, whose sequence
// numbers a message header lists (Calltap-Body-Chunks).

// AppendForward encodes req, body included, for another node.
func AppendForward(b []byte, req *Request) []byte {
	return append(appendRequestHead(b, req), req.Body...)
}

// DecodeForward parses what AppendForward wrote. Body aliases b.
func DecodeForward(b []byte) (*Request, error) { return decodeRequest(b) }

// AppendAnswer encodes a node's answer, body included.
func AppendAnswer(b []byte, a *Answer) []byte {
	return append(appendResponseHead(b, &Response{Status: a.Status, Header: a.Header}), a.Body...)
}

// DecodeAnswer parses what AppendAnswer wrote. Body aliases b.
func DecodeAnswer(b []byte) (*Answer, error) {
	r, err := decodeResponse(b)
	if err != nil {
		return nil, err
	}
	if r.Result != ResultOK {
		return nil, errMalformed
	}
	return &Answer{Status: r.Status, Header: r.Header, Body: r.Body}, nil
}
