// Claimants and the call → seat memory of a token several agents share.

package relaydb

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/calltap/calltap/storage/relaystate"
)

// SaveClaimant registers c, or updates its SeenAt and Connected: a seat
// keeps the CreatedAt of its first registration (and its claims, which
// its id is drawn from).
func (db *Store) SaveClaimant(ctx context.Context, c *relaystate.Claimant) (err error) {
	defer db.Explain(&err)
	claims := c.Claims
	if claims == nil {
		claims = []string{} // an array in the column, never null
	}
	js, err := json.Marshal(claims)
	if err != nil {
		return err
	}
	_, err = db.Writer().ExecContext(ctx, `INSERT INTO claimants (seat, tunnel_id, claims, created_at, seen_at, connected) VALUES (?, ?, ?, ?, ?, ?)
		ON CONFLICT (seat) DO UPDATE SET seen_at = excluded.seen_at, connected = excluded.connected`,
		c.Seat, c.TunnelID, string(js), c.CreatedAt.UnixMicro(), c.SeenAt.UnixMicro(), c.Connected)
	return err
}

// Claimants returns every registered seat of every token, the earliest
// registered first.
func (db *Store) Claimants(ctx context.Context) (_ []*relaystate.Claimant, err error) {
	defer db.Explain(&err)
	rows, err := db.Reader().QueryContext(ctx, `SELECT seat, tunnel_id, claims, created_at, seen_at, connected FROM claimants ORDER BY created_at, seat`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*relaystate.Claimant
	for rows.Next() {
		var (
			c             relaystate.Claimant
			claims        string
			created, seen int64
		)
		if err := rows.Scan(&c.Seat, &c.TunnelID, &claims, &created, &seen, &c.Connected); err != nil {
			return nil, err
		}
		if err := json.Unmarshal([]byte(claims), &c.Claims); err != nil {
			return nil, fmt.Errorf("the claims of seat %s: %w", c.Seat, err)
		}
		c.CreatedAt, c.SeenAt = time.UnixMicro(created).UTC(), time.UnixMicro(seen).UTC()
		out = append(out, &c)
	}
	return out, rows.Err()
}

// ReleaseClaimant removes a seat and its queue, together, and returns how
// many queued requests went with it; ErrNotFound for no such seat. The
// calls remembered for the seat stay until they expire.
func (db *Store) ReleaseClaimant(ctx context.Context, seat string) (_ int, err error) {
	defer db.Explain(&err)
	tx, err := db.Writer().BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, `DELETE FROM claimants WHERE seat = ?`, seat)
	if err != nil {
		return 0, err
	}
	if n, err := res.RowsAffected(); err != nil {
		return 0, err
	} else if n == 0 {
		return 0, fmt.Errorf("no claimant holds seat %q: %w", seat, ErrNotFound)
	}
	res, err = tx.ExecContext(ctx, `DELETE FROM queue WHERE tunnel_id = ?`, seat)
	if err != nil {
		return 0, err
	}
	dropped, err := res.RowsAffected()
	if err != nil {
		return 0, err
	}
	return int(dropped), tx.Commit()
}

// RememberCall records that rec.CallID of rec.TunnelID belongs to
// rec.Seat, unless the call is known already: then its record keeps its
// seat and takes rec.Last if it is later. It returns the seat the call
// belongs to. A record without First began at Last.
//
// The relay calls it on a request's path, once per call it has not
// cached: calls that arrive while a commit runs share the next one, as
// Enqueue's do, and each is one statement. Two remembering one call at
// once go through the one writer in turn, so the second gets the first's
// seat.
func (db *Store) RememberCall(ctx context.Context, rec relaystate.CallRecord) (_ string, err error) {
	defer db.Explain(&err)
	if rec.First.IsZero() {
		rec.First = rec.Last
	}
	// rec is this call's copy: its commit sets its Seat to the one kept.
	err = db.calls.do(&rec, func(batch []*relaystate.CallRecord) error { return db.rememberCalls(context.WithoutCancel(ctx), batch) })
	if err != nil {
		return "", err
	}
	return rec.Seat, nil
}

func (db *Store) rememberCalls(ctx context.Context, batch []*relaystate.CallRecord) error {
	return commitEach(ctx, db, batch,
		`INSERT INTO calls (tunnel_id, call_id, seat, first_at, last_at) VALUES (?, ?, ?, ?, ?)
		ON CONFLICT (tunnel_id, call_id) DO UPDATE SET last_at = max(last_at, excluded.last_at)
		RETURNING seat`,
		func(r *relaystate.CallRecord) []any {
			return []any{r.TunnelID, r.CallID, r.Seat, r.First.UnixMicro(), r.Last.UnixMicro()}
		},
		func(r *relaystate.CallRecord, seat string) { r.Seat = seat })
}

// CallSeat returns the seat of a known call; ErrNotFound otherwise.
func (db *Store) CallSeat(ctx context.Context, tunnelID, callID string) (_ string, err error) {
	defer db.Explain(&err)
	var seat string
	err = db.Reader().QueryRowContext(ctx, `SELECT seat FROM calls WHERE tunnel_id = ? AND call_id = ?`, tunnelID, callID).Scan(&seat)
	if errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("call %q of tunnel %s is not known: %w", callID, tunnelID, ErrNotFound)
	}
	return seat, err
}

// ExpireCalls forgets the calls whose last event came before cutoff, and
// returns how many.
func (db *Store) ExpireCalls(ctx context.Context, cutoff time.Time) (_ int64, err error) {
	defer db.Explain(&err)
	return db.deleteRows(ctx, `DELETE FROM calls WHERE last_at < ?`, cutoff.UnixMicro())
}

// CallsSince counts, by seat, the calls first seen at or after since.
func (db *Store) CallsSince(ctx context.Context, since time.Time) (_ map[string]int, err error) {
	defer db.Explain(&err)
	return readMap(ctx, db, `SELECT seat, count(*) FROM calls WHERE first_at >= ? GROUP BY seat`,
		func(n *int) []any { return []any{n} }, since.UnixMicro())
}
