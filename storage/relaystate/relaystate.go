// Package relaystate is what a relay keeps, as plain types: tokens and the
// requests queued for agents that are away. It imports no database driver,
// so that the NATS cluster (relay/cluster) and the relay's SQLite store
// (storage/relaydb) share these types without the cluster linking SQLite.
package relaystate

import (
	"crypto/sha256"
	"errors"
	"time"
)

// Token is a developer's credential on a relay, bound to one tunnel.
type Token struct {
	Name      string
	TunnelID  string
	CreatedAt time.Time
	RevokedAt *time.Time
}

// HashToken is how tokens are kept: only their SHA-256.
func HashToken(token string) []byte {
	h := sha256.Sum256([]byte(token))
	return h[:]
}

// QueuedRequest is a request held for a tunnel whose agent is away.
type QueuedRequest struct {
	Seq       int64
	ID        string
	TunnelID  string
	ArrivedAt int64 // unix µs
	Method    string
	URI       string
	Headers   []byte // wire-encoded, opaque here
	Body      []byte
}

// QueueStats is the size of one tunnel's queue.
type QueueStats struct {
	Count int
	Bytes int64
}

// Errors every store returns alike.
var (
	ErrNotFound = errors.New("not found") // a looked-up record does not exist
	ErrConflict = errors.New("conflict")  // a record with the same key exists
)

// Claimant is an agent's seat on a token shared by several agents: what it
// claims (calltap listen --claim), registered while it is connected and
// kept while it is away, so that its calls queue for it.
type Claimant struct {
	TunnelID string
	// Seat names the claimant: TunnelID + "-" + the claim set's key. It
	// is the key of its queue (QueuedRequest.TunnelID) and its holder.
	Seat   string
	Claims []string // canonical, sorted (relay/claim.Set.Strings)
	// CreatedAt is when the seat was first registered: of two claimants
	// whose claims both match a call, the earlier gets it.
	CreatedAt time.Time
	// SeenAt is when an agent last connected to or left the seat. A seat
	// away longer than the relay's claim TTL is released.
	SeenAt    time.Time
	Connected bool // an agent holds the seat, as its relay node last said
}

// CallRecord is which seat a call belongs to: the one its first event
// went to. It is kept until Last is older than the relay's call memory.
type CallRecord struct {
	TunnelID string
	CallID   string
	Seat     string
	First    time.Time
	Last     time.Time
}
