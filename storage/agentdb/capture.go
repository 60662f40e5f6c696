package agentdb

import "time"

// What a capture is (its fields, its states, its tries, what saving it
// assigned), apart from how
// the store reads it (captures.go) and writes it (capturewrite.go,
// intake.go): every file of the package uses it, and it uses none.

// Capture is one request the agent received, byte-exact, and what became of
// it. Headers are kept as JSON arrays of [name, value] pairs, in order.
type Capture struct {
	Seq            int64
	ID             string
	RelayID        string // the relay's request id; empty for local captures
	Source         string // tunnel | replay | backfill | trigger
	CreatedAt      time.Time
	ArrivedAt      time.Time // at the relay; zero unless it waited in the relay's queue
	Queued         bool      // its sender was answered 202 before the handler saw it (the relay's offline queue); an update sets it, never clears it
	Method         string
	Path           string
	Query          string
	RequestHeaders string // JSON
	Body           []byte
	Size           int // len(Body); set by List, which does not load bodies
	Target         string
	Route          string // the route it took: a route file's name, "default" or "filtered" (inspector/routes); "" when none decided

	Event       string
	CallID      string
	DeliveryID  string
	OccurredAt  string
	DuplicateOf string
	ReplayOf    string

	Status          string // pending | delivered | failed | unknown | stored
	ResponseStatus  int    // 0: no response
	ResponseHeaders string // JSON; "" when none
	ResponseBody    []byte
	Error           string
	Duration        time.Duration // -1: not finished
	DeliveredAt     time.Time
	Attempts        int
	MaxAttempts     int
	Keep            bool // retention never prunes it (SetKeep); only a delete removes it

	// LastAttempt, when set on an update, is recorded in the attempts log
	// in the same transaction.
	LastAttempt *Attempt

	bodyFile   string // the segment holding Body once written (StageBody, or WriteCaptures for one not staged); "" before
	bodyOffset int64  // where in it
}

// Capture status values.
const (
	StatusPending   = "pending"
	StatusDelivered = "delivered"
	StatusFailed    = "failed"
	// StatusUnknown: the agent was killed after saving a live request
	// and before recording the handler's answer. The handler may have
	// answered and the sender may have got that answer, or not: nobody
	// can tell any more, and the store does not pretend to.
	StatusUnknown = "unknown"
	// StatusStored: kept, sent nowhere: its route is store-only, or
	// --events left its kind out. calltap answered its sender 2xx itself.
	StatusStored = "stored"
)

// Attempt is one try at delivering a capture to the local handler.
type Attempt struct {
	N              int
	At             time.Time
	ResponseStatus int
	Error          string
	Duration       time.Duration
}

// Written is what WriteCaptures (or LogCaptures) assigned to one inserted
// capture.
type Written struct {
	Seq         int64  // its place in the store
	ID          string // its id: the one given, or the first copy's when Redelivered
	DuplicateOf string // the first capture of the same delivery id, if any
	// Redelivered: a capture with the same RelayID was saved before (the
	// relay sent a queued request again because our ack was lost); that
	// row is kept and nothing was inserted.
	Redelivered bool
}
