// Which seat each call of a token with claimant seats belongs to: bucket
// calltap_calls, one entry per call, its key the tunnel id and a hash of
// the call id (a sender chooses the call id: it never becomes a key or a
// subject as it is), its value the relaystate.CallRecord as JSON. The
// bucket's max age forgets a call CallMemory after its entry's last
// write, which RememberCall renews as the call's events go on.

package cluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/calltap/calltap/storage/relaystate"
	"github.com/nats-io/nats.go/jetstream"
)

// calls is the call memory in calltap_calls.
type calls struct {
	*link
	kv jetstream.KeyValue
}

// callKey is the key of a call's entry.
func callKey(tunnelID, callID string) string {
	sum := sha256.Sum256([]byte(callID))
	return tunnelID + "." + hex.EncodeToString(sum[:16])
}

// touchAfter is how much later than its entry's Last a call's event must
// be for RememberCall to write the entry again: a write is a round of the
// bucket's replication, and a minute is nothing against CallMemory.
const touchAfter = time.Minute

// RememberCall records that rec.CallID of rec.TunnelID belongs to
// rec.Seat, unless the call is known already: then its entry keeps its
// seat, and takes rec.Last if that is later by touchAfter or more, which
// restarts the entry's age. It returns the seat the call belongs to. Of
// nodes remembering one call at once, one creates the entry and the
// others read it back from the leader: one seat, for all.
func (c *calls) RememberCall(ctx context.Context, rec relaystate.CallRecord) (string, error) {
	if !validSeat(rec.TunnelID) {
		return "", fmt.Errorf("tunnel id %q: not a tunnel", rec.TunnelID)
	}
	if rec.First.IsZero() {
		rec.First = rec.Last
	}
	if err := c.connected(ctx); err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	defer c.stalled("remember a call's seat", "tunnel", rec.TunnelID)()
	key := callKey(rec.TunnelID, rec.CallID)
	b, err := json.Marshal(rec)
	if err != nil {
		return "", err
	}
	for {
		_, err := c.kv.Create(ctx, key, b)
		if err == nil {
			return rec.Seat, nil
		}
		if !casMissed(err) {
			return "", err
		}
		seat, err := c.touch(ctx, key, rec.Last)
		if errors.Is(err, jetstream.ErrKeyNotFound) || casMissed(err) {
			continue // gone (expired) or rewritten between the two: again
		}
		return seat, err
	}
}

// touch reads a known call's entry from the leader (a replica may not
// have the entry whose create just failed), and writes it again with
// last if that is touchAfter or more after its Last. It returns the
// entry's seat.
func (c *calls) touch(ctx context.Context, key string, last time.Time) (string, error) {
	var kept relaystate.CallRecord
	rev, err := c.lastRecord(ctx, bucketCalls, key, &kept)
	if err != nil || last.Sub(kept.Last) < touchAfter {
		return kept.Seat, err
	}
	kept.Last = last
	b, err := json.Marshal(kept)
	if err != nil {
		return "", err
	}
	if _, err := c.kv.Update(ctx, key, b, rev); err != nil {
		return "", err
	}
	return kept.Seat, nil
}

// CallSeat returns the seat of a known call; ErrNotFound otherwise. It
// reads any replica: one that has not heard of a call remembered a
// moment ago sends the relay to RememberCall, which finds it.
func (c *calls) CallSeat(ctx context.Context, tunnelID, callID string) (string, error) {
	if !validSeat(tunnelID) {
		return "", fmt.Errorf("tunnel id %q: %w", tunnelID, relaystate.ErrNotFound)
	}
	if err := c.connected(ctx); err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	e, err := c.kv.Get(ctx, callKey(tunnelID, callID))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return "", fmt.Errorf("call %q of tunnel %s is not known: %w", callID, tunnelID, relaystate.ErrNotFound)
	} else if err != nil {
		return "", err
	}
	var rec relaystate.CallRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return "", fmt.Errorf("the record of call %q of tunnel %s: %w", callID, tunnelID, err)
	}
	return rec.Seat, nil
}

// readAllFor bounds CallsSince's read of the whole bucket: what an
// operator's command waits for at most.
const readAllFor = 30 * time.Second

// ExpireCalls does nothing: the bucket's max age forgets a call
// CallMemory after its entry's last write.
func (c *calls) ExpireCalls(context.Context, time.Time) (int64, error) { return 0, nil }

// CallsSince counts, by seat, the calls first seen at or after since. It
// reads every entry of the bucket (one watch, no round trip each): an
// operator's command, not a request's path.
func (c *calls) CallsSince(ctx context.Context, since time.Time) (map[string]int, error) {
	if err := c.connected(ctx); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, readAllFor)
	defer cancel()
	w, err := c.kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	out := map[string]int{}
	for e := range w.Updates() {
		if e == nil {
			return out, nil // every entry the bucket held is read
		}
		var rec relaystate.CallRecord
		if json.Unmarshal(e.Value(), &rec) != nil {
			c.log.Warn("unreadable call record in NATS", "key", e.Key())
			continue
		}
		if !rec.First.Before(since) {
			out[rec.Seat]++
		}
	}
	return out, ctx.Err()
}
