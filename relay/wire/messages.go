package wire

// Every message of the protocol, with its layout in bytes. The encoders and
// decoders are in codec.go.

// Hello is the relay's first frame on a new agent connection.
//
//	0x01 json(Hello)
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
	// Leave: the relay reads the Leave frame of an agent that stops.
	Leave bool `json:"leave,omitempty"`
	// Claims are the claims the relay holds this agent's seat by, as it
	// parsed them: an agent that sent claims and finds none here is on a
	// relay that does not know claims, and would get the default's calls.
	Claims []string `json:"claims,omitempty"`
}

// Request is one request of a sender, as the relay hands it to the agent.
//
//	0x02 stream flags arrivedAt:varint(unix µs) id:string method:string uri:string headers body...
//
// flags: bit 0 (requestFlagQueued) set for a request from the offline
// queue. The body is the rest of the frame.
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

// Ack is the agent's word that it saved the request of Stream.
//
//	0x03 stream
type Ack struct {
	Stream uint64
}

// Response is the local handler's answer, or why there is none.
//
//	0x04 stream status result:byte error:string headers body...
//
// Status, headers and body mean something only with ResultOK. The body is
// the rest of the frame.
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

// Notice carries counters for the agent's console; sent when they change.
//
//	0x05 json(Notice)
type Notice struct {
	Rejected int64 `json:"rejected"` // senders refused by --require-header
	Queued   int   `json:"queued"`   // requests still in the offline queue
}

// GoAway tells the agent why its connection is being closed, or, with
// GoAwayLeft, that no request follows its Leave.
//
//	0x06 reason:byte message:string
type GoAway struct {
	Reason  GoAwayReason
	Message string
}

// GoAwayReason says why the relay sent GoAway.
type GoAwayReason byte

const (
	GoAwayShutdown GoAwayReason = 1 // relay shutting down: reconnect
	GoAwayReplaced GoAwayReason = 2 // a newer agent took the tunnel: exit
	GoAwayRevoked  GoAwayReason = 3 // the token was revoked: exit
	// GoAwayLeft answers the agent's Leave: no request follows it, and
	// the connection stays open for the answers in flight.
	GoAwayLeft GoAwayReason = 4
	// GoAwayHeld refuses an agent run older than the one holding the
	// tunnel (InstanceHeader): exit, and do not try again. Only an agent
	// that sent its instance is told this.
	GoAwayHeld GoAwayReason = 5
)

// Leave is the agent's word that it is stopping: the relay sends it no
// more requests and answers GoAwayLeft.
//
//	0x07
type Leave struct{}

// Answer is what a sender is to get, as a relay node that holds the agent
// answers a request another node forwarded it.
//
//	0x04 0x00 status 0x00 "" headers body...   (a Response, Stream 0, ResultOK)
type Answer struct {
	Status int
	Header Header
	Body   []byte
}
