// Which run of an agent connects: what the relay orders two agents of one
// token by.

package wire

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Instance names one run of an agent: when it started (Unix nanoseconds,
// on its own clock) and a random id that breaks a tie. It goes in the
// handshake as InstanceHeader, "<start>.<id>". The zero Instance is an
// agent that did not say (an older calltap).
type Instance struct {
	Start int64  `json:"start"`
	ID    string `json:"id"`
}

// NewInstance names a run starting now.
func NewInstance() Instance {
	var b [8]byte
	rand.Read(b[:]) // never fails
	return Instance{Start: time.Now().UnixNano(), ID: hex.EncodeToString(b[:])}
}

// IsZero reports an agent that did not say which run it is.
func (i Instance) IsZero() bool { return i == Instance{} }

// String is the header's value.
func (i Instance) String() string { return strconv.FormatInt(i.Start, 10) + "." + i.ID }

// ParseInstance reads an InstanceHeader value.
func ParseInstance(s string) (Instance, error) {
	start, id, ok := strings.Cut(s, ".")
	n, err := strconv.ParseInt(start, 10, 64)
	if !ok || err != nil || n <= 0 || id == "" || len(id) > 64 {
		return Instance{}, fmt.Errorf("%s must be '<start>.<id>'", InstanceHeader)
	}
	return Instance{Start: n, ID: id}, nil
}

// OlderThan reports whether i started before o (on a tie, the smaller id
// counts as older), so that o, not i, is to hold their tunnel. An agent
// that did not say is older than none and none is older than it: it takes
// over as agents always did.
func (i Instance) OlderThan(o Instance) bool {
	if i.IsZero() || o.IsZero() {
		return false
	}
	if i.Start != o.Start {
		return i.Start < o.Start
	}
	return i.ID < o.ID
}
