// The claimant seats of tokens several agents share: bucket
// calltap_claims, one entry per seat (its key the seat id, its value the
// relaystate.Claimant as JSON), mirrored on every node so that the relay
// reads the registry without a round trip. Entries change by
// compare-and-swap over the leader's copy: nodes marking one seat
// connected and away at once keep its first registration's CreatedAt.

package cluster

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/calltap/calltap/storage/relaystate"
	"github.com/nats-io/nats.go/jetstream"
)

// claimants is the mirror of calltap_claims.
type claimants struct {
	*link
	kv    jetstream.KeyValue
	queue *queue // a released seat's queue goes with it

	mu      sync.Mutex
	entries map[string]claimantEntry // guarded by mu; seat → its newest record known here
}

// claimantEntry is a seat's record at a revision of the bucket; a nil
// record is a seat released, kept so that an older write seen late does
// not bring it back.
type claimantEntry struct {
	rec *relaystate.Claimant
	rev uint64
}

func newClaimants(l *link, kv jetstream.KeyValue, q *queue) *claimants {
	return &claimants{link: l, kv: kv, queue: q, entries: map[string]claimantEntry{}}
}

// apply brings an entry of the bucket into the mirror.
func (c *claimants) apply(e jetstream.KeyValueEntry) {
	var rec *relaystate.Claimant
	if e.Operation() == jetstream.KeyValuePut {
		rec = new(relaystate.Claimant)
		if json.Unmarshal(e.Value(), rec) != nil {
			c.log.Warn("unreadable claimant record in NATS", "key", e.Key())
			return
		}
	}
	c.keep(e.Key(), claimantEntry{rec, e.Revision()})
}

// keep stores e unless the mirror has seat at a later revision.
func (c *claimants) keep(seat string, e claimantEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cur, ok := c.entries[seat]; ok && cur.rev > e.rev {
		return
	}
	c.entries[seat] = e
}

// Claimants returns every registered seat of every token from the mirror,
// the earliest registered first (ties by seat, as the SQLite store orders
// them). Each is a copy of the caller's own.
func (c *claimants) Claimants(context.Context) ([]*relaystate.Claimant, error) {
	c.mu.Lock()
	out := make([]*relaystate.Claimant, 0, len(c.entries))
	for _, e := range c.entries {
		if e.rec != nil {
			rec := *e.rec
			rec.Claims = slices.Clone(rec.Claims)
			out = append(out, &rec)
		}
	}
	c.mu.Unlock()
	slices.SortFunc(out, func(a, b *relaystate.Claimant) int {
		return cmp.Or(a.CreatedAt.Compare(b.CreatedAt), strings.Compare(a.Seat, b.Seat))
	})
	return out, nil
}

// SaveClaimant registers rec, or updates its SeenAt and Connected: a seat
// keeps the CreatedAt and the claims of its first registration. The
// mirror has the write when SaveClaimant returns.
func (c *claimants) SaveClaimant(ctx context.Context, rec *relaystate.Claimant) error {
	if !validSeat(rec.Seat) {
		return fmt.Errorf("seat id %q: not a seat", rec.Seat)
	}
	if err := c.connected(ctx); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	defer c.stalled("register a claimant", "seat", rec.Seat)()
	for {
		kept, rev, err := c.save(ctx, rec)
		if casMissed(err) {
			continue // another node wrote between the read and the swap
		}
		if err != nil {
			return err
		}
		c.keep(rec.Seat, claimantEntry{kept, rev})
		return nil
	}
}

// save is one try of SaveClaimant: rec as a new seat, or the seat's
// record with rec's SeenAt and Connected, swapped for the one read.
func (c *claimants) save(ctx context.Context, rec *relaystate.Claimant) (*relaystate.Claimant, uint64, error) {
	var kept relaystate.Claimant
	rev, err := c.lastRecord(ctx, bucketClaims, rec.Seat, &kept)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		kept = *rec
		kept.Claims = slices.Clone(rec.Claims) // the mirror's, not the caller's
	} else if err != nil {
		return nil, 0, err
	}
	kept.SeenAt, kept.Connected = rec.SeenAt, rec.Connected
	b, err := json.Marshal(kept)
	if err != nil {
		return nil, 0, err
	}
	if rev == 0 {
		rev, err = c.kv.Create(ctx, rec.Seat, b)
	} else {
		rev, err = c.kv.Update(ctx, rec.Seat, b, rev)
	}
	return &kept, rev, err
}

// ReleaseClaimant removes a seat, then its queue, and returns how many
// queued requests went with it; ErrNotFound for no such seat. The calls
// remembered for the seat stay until they expire. Unlike SQLite's, the
// two steps are not one transaction: a queue a failed purge left is said
// in the error, and goes with the stream's max age.
func (c *claimants) ReleaseClaimant(ctx context.Context, seat string) (int, error) {
	if !validSeat(seat) {
		return 0, fmt.Errorf("no claimant holds seat %q: %w", seat, relaystate.ErrNotFound)
	}
	if err := c.connected(ctx); err != nil {
		return 0, err
	}
	if err := c.unregister(ctx, seat); err != nil {
		return 0, err
	}
	n, err := c.queue.purgeSeat(ctx, seat)
	if err != nil {
		return 0, fmt.Errorf("seat %s released, but its queue is left until it expires: %w", seat, err)
	}
	return n, nil
}

// unregister deletes seat's record, whatever revision it has by then.
func (c *claimants) unregister(ctx context.Context, seat string) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	defer c.stalled("release a claimant", "seat", seat)()
	for {
		_, rev, err := c.lastEntry(ctx, bucketClaims, seat)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return fmt.Errorf("no claimant holds seat %q: %w", seat, relaystate.ErrNotFound)
		} else if err != nil {
			return err
		}
		err = c.kv.Delete(ctx, seat, jetstream.LastRevision(rev))
		if casMissed(err) {
			continue // marked connected or away meanwhile: released all the same
		}
		if err != nil {
			return err
		}
		// The delete's revision is rev+1 or later: the record read, seen
		// late from the watch, must not bring the seat back.
		c.keep(seat, claimantEntry{nil, rev + 1})
		return nil
	}
}
