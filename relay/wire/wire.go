// Package wire is the protocol between the relay and an agent: the frames
// that cross a tunnel's websocket, how each is laid out in bytes, and the
// request and answer that cross between relay nodes. Both ends import it;
// it knows nothing of sockets (relay/frameconn carries the frames) and
// nothing of either end's state.
//
// Flow:
//
//	agent                                   relay
//	  | -- GET /_calltap/connect (upgrade) --> |  Authorization: Bearer <token>
//	  |    Sec-WebSocket-Protocol: calltap.v1  |  Calltap-Require-Header: <name: value> (0..n)
//	  |                                        |  Calltap-Max-Frame: <agent's read limit>
//	  |                                        |  Calltap-Instance: <start>.<id> of this agent run
//	  |                                        |  Calltap-Claim: <claim> (0..n, relay/claim)
//	  | <---------------- Hello -------------- |  tunnel id, public URL, limits, claims held
//	  |                                        |
//	  | <-------------- Request -------------- |  a sender hit /t/<tunnel>/...; or a queued one
//	  |  (agent saves it in SQLite)            |
//	  | ---------------- Ack ----------------> |  saved: the relay may now forget a queued one
//	  |                                        |  (live: left out when the response follows at once)
//	  |  (agent forwards it to the handler)    |
//	  | --------------- Response ------------> |  status, headers, body (live requests only),
//	  |                                        |  or "queued" (ResultQueued)
//	  |                                        |
//	  | <-------------- Notice --------------- |  counters the agent's console shows
//	  | <-------------- GoAway --------------- |  why the relay is closing this connection
//	  |                                        |
//	  | ---------------- Leave --------------> |  the agent is stopping: send no more requests
//	  | <--------- GoAway (GoAwayLeft) ------- |  none follows; answers in flight still go back
//
// One token serves one agent per seat. An agent that sends no claim takes
// the token's default seat (what no claim matches); one that sends claims
// takes the seat named by its claim set (claim.Set.Key), and gets the calls
// whose first event its claims match. An agent run that connects takes its
// seat over from the one connected, unless both sent Calltap-Instance and
// the one connected started later; the relay then answers the newcomer
// GoAway GoAwayHeld, and it exits. A run's reconnect (same instance) always
// takes its seat back from its own stale connection. A claim set that
// shares a claim with another seat of the token, or that would take the
// token past its claim limit, is refused before the upgrade (409).
//
// Each frame is exactly one binary websocket message, so a request costs one
// message each way (plus the ack, for a queued request or a slow handler).
// Keepalive uses websocket ping/pong control frames. The relay pings every
// second, each ping carrying 8 bytes the pong must give back (as RFC 6455
// has every pong do): an agent that owes a pong for 3 s is taken for
// frozen, and its requests are queued until it answers. Many requests are
// in flight at once; stream ids tie the frames of one request together and
// are chosen by the relay, unique per connection.
//
// Every frame begins with one type byte (FrameHello...). Integers are
// unsigned varints (encoding/binary's Uvarint) unless stated; a "string" is
// a varint length followed by that many bytes; "headers" is a varint count
// followed by that many (name string, value string) pairs in the order they
// arrived, so repeated headers and their order survive. storage/varfield
// reads and writes these fields. Each message's layout is on its type, in
// messages.go.
//
// An agent that stops sends Leave (to a relay whose Hello has Leave set),
// then answers what it holds: the relay queues new requests from the
// moment it reads Leave, sends no request after its GoAway "left", and
// keeps the connection open until the agent closes it.
//
// The agent hands requests to its handler one at a time, in arrival order,
// while any it got from the offline queue (or saved but did not send before
// it last stopped) are still waiting; a live request arriving then waits
// its turn. One that would still be waiting when the relay's forward
// timeout (Hello.ForwardTimeoutMS) runs out is answered with ResultQueued
// once saved: the relay answers its sender 202 as for a request it queued
// itself, and the agent delivers it later, in order. An agent sends
// ResultQueued only to a relay whose Hello gives its forward timeout.
//
// The body is the rest of the frame: it is never length-prefixed, so it is
// written straight after the header bytes without being copied into a new
// buffer. Each end reads frames up to its own limit (websocket read limit)
// and tells the other: the agent in its handshake (Calltap-Max-Frame), the
// relay in its Hello (MaxFrame, with MaxBody, the largest body it takes
// either way). A frame the peer would not read is never written: a
// connection's frames share one websocket, and an oversized one would close
// it under every request in flight.
//
// Between relay nodes (calltap relay --nats), a request taken by one node
// for a tunnel whose agent another holds crosses in one NATS request to
// that node (relay/cluster):
//
//	request data: a Request frame, Stream 0 (AppendForward)
//	reply data:   a Response frame, Stream 0, Result 0, carrying the
//	              status, headers and body the sender is to get (AppendAnswer)
//
// A body too large for one NATS message is left out of the frame and
// travels in chunks through the CALLTAP_BODIES stream, whose sequence
// numbers a message header lists (Calltap-Body-Chunks).
package wire

import "errors"

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

// InstanceHeader carries, in the agent's handshake, which run of an agent
// connects (Instance): of two agents with one token, the relay keeps the
// one started later.
const InstanceHeader = "Calltap-Instance"

// ClaimHeader carries, in the agent's handshake, one claim of the agent
// (calltap listen --claim), as relay/claim parses it.
const ClaimHeader = "Calltap-Claim"

// DefaultMaxFrame bounds one frame: the default body limit (10 MiB) plus room
// for headers.
const DefaultMaxFrame = 10<<20 + 1<<20

// Frame types: the first byte of every frame.
const (
	FrameHello    byte = 0x01
	FrameRequest  byte = 0x02
	FrameAck      byte = 0x03
	FrameResponse byte = 0x04
	FrameNotice   byte = 0x05
	FrameGoAway   byte = 0x06
	FrameLeave    byte = 0x07
)

// ErrFrameTooLarge is a frame larger than the peer reads: it is not sent.
var ErrFrameTooLarge = errors.New("relay: frame exceeds the maximum size")

// ErrMalformed is returned for any frame that does not parse, or that comes
// where the protocol has no place for it.
var ErrMalformed = errors.New("relay: malformed frame")
