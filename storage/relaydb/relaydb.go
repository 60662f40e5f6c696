// Package relaydb is the relay's SQLite database: developers' tokens, the
// relay's settings and the offline queue of requests held for agents that
// are away (calltap relay, and dev's local relay). Its records are
// relaystate's plain types; the schema is its migrations folder, embedded,
// and the core (opening, migrations, damage reports) is package storage's.
// A team relay keeps the same state in NATS instead (relay/cluster).
package relaydb

import (
	"context"
	"crypto/subtle"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"sync"
	"time"

	"github.com/calltap/calltap/storage"
	"github.com/calltap/calltap/storage/relaystate"
)

// Schema names the relay's database.
const Schema storage.Schema = "relay"

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Store is the relay's database: tokens, settings, the offline queue, and
// the claimants and calls of shared tokens (claims.go).
type Store struct {
	*storage.DB
	enqueues groupCommit[*QueuedRequest]
	calls    groupCommit[*relaystate.CallRecord] // RememberCall's commits
}

// Open opens (creating if needed) the relay's database at path.
func Open(ctx context.Context, path string, opts ...storage.Option) (*Store, error) {
	migrations, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		return nil, err
	}
	db, err := storage.Open(ctx, path, Schema, migrations, opts...)
	if err != nil {
		return nil, err
	}
	return &Store{DB: db}, nil
}

// The relay's records are relaystate's, which the NATS cluster shares
// without linking SQLite.
type (
	Token         = relaystate.Token
	QueuedRequest = relaystate.QueuedRequest
	QueueStats    = relaystate.QueueStats
)

// HashToken is how tokens are kept: only their SHA-256.
func HashToken(token string) []byte { return relaystate.HashToken(token) }

// CreateToken stores a new token for name, bound to tunnelID.
func (db *Store) CreateToken(ctx context.Context, name, token, tunnelID string) (_ *Token, err error) {
	defer db.Explain(&err)
	now := time.Now().UTC()
	_, err = db.Writer().ExecContext(ctx, `INSERT INTO tokens (name, token_hash, tunnel_id, created_at) VALUES (?, ?, ?, ?)`,
		name, HashToken(token), tunnelID, now.UnixMicro())
	if err != nil {
		if strings.Contains(err.Error(), "UNIQUE") {
			return nil, fmt.Errorf("a token named %q exists already: %w", name, ErrConflict)
		}
		return nil, err
	}
	return &Token{Name: name, TunnelID: tunnelID, CreatedAt: now}, nil
}

// ErrConflict is returned when a row with the same key exists.
var ErrConflict = relaystate.ErrConflict

// ErrNotFound is returned when a looked-up row does not exist.
var ErrNotFound = relaystate.ErrNotFound

// Authenticate returns the live token whose hash matches token.
func (db *Store) Authenticate(ctx context.Context, token string) (_ *Token, err error) {
	defer db.Explain(&err)
	want := HashToken(token)
	var (
		t       Token
		hash    []byte
		created int64
		revoked sql.NullInt64
	)
	err = db.Reader().QueryRowContext(ctx, `SELECT name, token_hash, tunnel_id, created_at, revoked_at FROM tokens WHERE token_hash = ?`, want).
		Scan(&t.Name, &hash, &t.TunnelID, &created, &revoked)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	} else if err != nil {
		return nil, err
	}
	// The index lookup found the row; the comparison that decides is constant-time.
	if subtle.ConstantTimeCompare(hash, want) != 1 || revoked.Valid {
		return nil, ErrNotFound
	}
	t.CreatedAt = time.UnixMicro(created).UTC()
	return &t, nil
}

// TokenByName returns one token, revoked or not.
func (db *Store) TokenByName(ctx context.Context, name string) (_ *Token, err error) {
	defer db.Explain(&err)
	ts, err := db.listTokens(ctx, `WHERE name = ?`, name)
	if err != nil {
		return nil, err
	}
	if len(ts) == 0 {
		return nil, ErrNotFound
	}
	return ts[0], nil
}

// Tokens lists every token, oldest first.
func (db *Store) Tokens(ctx context.Context) (_ []*Token, err error) {
	defer db.Explain(&err)
	return db.listTokens(ctx, "")
}

func (db *Store) listTokens(ctx context.Context, where string, args ...any) ([]*Token, error) {
	rows, err := db.Reader().QueryContext(ctx, `SELECT name, tunnel_id, created_at, revoked_at FROM tokens `+where+` ORDER BY created_at`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*Token
	for rows.Next() {
		var (
			t       Token
			created int64
			revoked sql.NullInt64
		)
		if err := rows.Scan(&t.Name, &t.TunnelID, &created, &revoked); err != nil {
			return nil, err
		}
		t.CreatedAt = time.UnixMicro(created).UTC()
		if revoked.Valid {
			r := time.UnixMicro(revoked.Int64).UTC()
			t.RevokedAt = &r
		}
		out = append(out, &t)
	}
	return out, rows.Err()
}

// RevokeToken marks name's token revoked. Its tunnel id stays reserved.
func (db *Store) RevokeToken(ctx context.Context, name string) (err error) {
	defer db.Explain(&err)
	res, err := db.Writer().ExecContext(ctx, `UPDATE tokens SET revoked_at = ? WHERE name = ? AND revoked_at IS NULL`, time.Now().UnixMicro(), name)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}

// TunnelLive reports whether tunnelID belongs to a token that is not revoked.
func (db *Store) TunnelLive(ctx context.Context, tunnelID string) (_ bool, err error) {
	defer db.Explain(&err)
	var n int
	err = db.Reader().QueryRowContext(ctx, `SELECT count(*) FROM tokens WHERE tunnel_id = ? AND revoked_at IS NULL`, tunnelID).Scan(&n)
	return n > 0, err
}

// RevokedTunnels returns the tunnel ids of every revoked token.
func (db *Store) RevokedTunnels(ctx context.Context) (_ map[string]bool, err error) {
	defer db.Explain(&err)
	rows, err := db.Reader().QueryContext(ctx, `SELECT tunnel_id FROM tokens WHERE revoked_at IS NOT NULL`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]bool{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		out[id] = true
	}
	return out, rows.Err()
}

// Setting returns a relay setting, or "" when unset.
func (db *Store) Setting(ctx context.Context, key string) (_ string, err error) {
	defer db.Explain(&err)
	var v string
	err = db.Reader().QueryRowContext(ctx, `SELECT value FROM settings WHERE key = ?`, key).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	return v, err
}

// SetSetting stores a relay setting.
func (db *Store) SetSetting(ctx context.Context, key, value string) (err error) {
	defer db.Explain(&err)
	_, err = db.Writer().ExecContext(ctx, `INSERT INTO settings (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value`, key, value)
	return err
}

// Enqueue appends r to its tunnel's queue and returns once it is committed.
// Calls that arrive while a commit runs share the next one: with every
// commit synced (SyncFull), a burst of senders pays for one sync, not one
// each. A failed commit fails every request in it, none of which has been
// acknowledged to its sender.
func (db *Store) Enqueue(ctx context.Context, r *QueuedRequest) (err error) {
	defer db.Explain(&err)
	return db.enqueues.do(r, func(batch []*QueuedRequest) error { return db.enqueue(context.WithoutCancel(ctx), batch) })
}

func (db *Store) enqueue(ctx context.Context, batch []*QueuedRequest) error {
	return commitEach(ctx, db, batch,
		`INSERT INTO queue (id, tunnel_id, arrived_at, method, uri, headers, body, size) VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING seq`,
		func(r *QueuedRequest) []any {
			return []any{r.ID, r.TunnelID, r.ArrivedAt, r.Method, r.URI, r.Headers, r.Body, len(r.Body) + len(r.Headers) + len(r.URI)}
		},
		func(r *QueuedRequest, seq int64) { r.Seq = seq })
}

// commitEach runs query, an insert that returns one column, once for each
// of batch, with the arguments args gives, in one transaction. Each is
// given what its insert returned (set) only once the transaction has
// committed: of a batch that fails, none is told it was kept.
func commitEach[T, R any](ctx context.Context, db *Store, batch []T, query string, args func(T) []any, set func(T, R)) error {
	tx, err := db.Writer().BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	stmt, err := tx.PrepareContext(ctx, query)
	if err != nil {
		return err
	}
	defer stmt.Close()
	out := make([]R, len(batch))
	for i, v := range batch {
		if err := stmt.QueryRowContext(ctx, args(v)...).Scan(&out[i]); err != nil {
			return err
		}
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	for i, v := range batch {
		set(v, out[i])
	}
	return nil
}

// groupCommit lets concurrent callers share one commit. One caller at a
// time leads: it commits everything waiting, in arrival order, then hands
// the lead to the first caller that came meanwhile, and returns. The others
// wait for the commit that took theirs. No goroutine of its own.
type groupCommit[T any] struct {
	mu      sync.Mutex
	pending []groupItem[T] // guarded by mu
	leading bool           // guarded by mu: a caller leads
}

type groupItem[T any] struct {
	v    T
	done chan error // buffered: a send never waits
}

// errLead tells a waiting caller that it leads now.
var errLead = errors.New("relaydb: lead the next commit")

func (g *groupCommit[T]) do(v T, commit func([]T) error) error {
	it := groupItem[T]{v: v, done: make(chan error, 1)}
	g.mu.Lock()
	g.pending = append(g.pending, it)
	if g.leading {
		g.mu.Unlock()
		if err := <-it.done; err != errLead {
			return err
		}
		g.mu.Lock()
	}
	g.leading = true
	batch := g.pending
	g.pending = nil
	g.mu.Unlock()
	vs := make([]T, len(batch))
	for i, b := range batch {
		vs[i] = b.v
	}
	err := commit(vs)
	for _, b := range batch {
		b.done <- err
	}
	g.mu.Lock()
	if len(g.pending) > 0 {
		g.pending[0].done <- errLead
	} else {
		g.leading = false
	}
	g.mu.Unlock()
	return <-it.done
}

// QueuedAfter returns up to limit requests of tunnelID with seq > after, in order.
func (db *Store) QueuedAfter(ctx context.Context, tunnelID string, after int64, limit int) (_ []*QueuedRequest, err error) {
	defer db.Explain(&err)
	rows, err := db.Reader().QueryContext(ctx, `SELECT seq, id, arrived_at, method, uri, headers, body FROM queue WHERE tunnel_id = ? AND seq > ? ORDER BY seq LIMIT ?`, tunnelID, after, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*QueuedRequest
	for rows.Next() {
		r := &QueuedRequest{TunnelID: tunnelID}
		if err := rows.Scan(&r.Seq, &r.ID, &r.ArrivedAt, &r.Method, &r.URI, &r.Headers, &r.Body); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// Dequeue removes delivered requests by seq.
func (db *Store) Dequeue(ctx context.Context, seqs ...int64) (err error) {
	defer db.Explain(&err)
	if len(seqs) == 0 {
		return nil
	}
	tx, err := db.Writer().BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	stmt, err := tx.PrepareContext(ctx, `DELETE FROM queue WHERE seq = ?`)
	if err != nil {
		return err
	}
	defer stmt.Close()
	for _, s := range seqs {
		if _, err := stmt.ExecContext(ctx, s); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// QueueStatsByTunnel sizes every tunnel's queue.
func (db *Store) QueueStatsByTunnel(ctx context.Context) (_ map[string]QueueStats, err error) {
	defer db.Explain(&err)
	return readMap(ctx, db, `SELECT tunnel_id, count(*), coalesce(sum(size), 0) FROM queue GROUP BY tunnel_id`,
		func(s *QueueStats) []any { return []any{&s.Count, &s.Bytes} })
}

// readMap reads the rows of query, each a key and then the fields of its
// value, into a map.
func readMap[V any](ctx context.Context, db *Store, query string, fields func(*V) []any, args ...any) (map[string]V, error) {
	rows, err := db.Reader().QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]V{}
	for rows.Next() {
		var (
			key string
			v   V
		)
		if err := rows.Scan(append([]any{&key}, fields(&v)...)...); err != nil {
			return nil, err
		}
		out[key] = v
	}
	return out, rows.Err()
}

// ExpireQueued drops queued requests that arrived before cutoff and returns
// how many went, per tunnel.
func (db *Store) ExpireQueued(ctx context.Context, cutoff time.Time) (_ int64, err error) {
	defer db.Explain(&err)
	return db.deleteRows(ctx, `DELETE FROM queue WHERE arrived_at < ?`, cutoff.UnixMicro())
}

// deleteRows runs a delete and returns how many rows went.
func (db *Store) deleteRows(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := db.Writer().ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// TunnelQueueStats sizes one tunnel's queue.
func (db *Store) TunnelQueueStats(ctx context.Context, tunnelID string) (_ QueueStats, err error) {
	defer db.Explain(&err)
	var s QueueStats
	err = db.Reader().QueryRowContext(ctx, `SELECT count(*), coalesce(sum(size), 0) FROM queue WHERE tunnel_id = ?`, tunnelID).Scan(&s.Count, &s.Bytes)
	return s, err
}
