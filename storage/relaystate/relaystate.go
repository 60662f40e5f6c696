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
