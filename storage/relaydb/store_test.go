package relaydb

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func open(t *testing.T) *Store {
	t.Helper()
	return openAt(t, filepath.Join(t.TempDir(), "relay.db"))
}

// openAt opens the store at path, to be closed when the test ends if it
// was not before.
func openAt(t *testing.T, path string) *Store {
	t.Helper()
	db, err := Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func wantErr(t *testing.T, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Errorf("%s: err = %v, want %v", what, err, target)
	}
}

// describe is what a test compares of a token: all but its times.
func describe(tok *Token, err error) string {
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("%s on %s, revoked %v", tok.Name, tok.TunnelID, tok.RevokedAt != nil)
}

// createTokens makes ada (tun-a) and bob (tun-b).
func createTokens(t *testing.T, db *Store) {
	t.Helper()
	for _, name := range []string{"ada", "bob"} {
		if _, err := db.CreateToken(context.Background(), name, "secret-"+name, "tun-"+name[:1]); err != nil {
			t.Fatal(err)
		}
	}
}

// A token is created live, at the time of its creation; a second token of
// the same name, or on the same tunnel, is a conflict; another failure is
// not called one.
func TestCreateToken(t *testing.T) {
	ctx, db := context.Background(), open(t)
	before := time.Now().UTC().Truncate(time.Microsecond)
	tok, err := db.CreateToken(ctx, "ada", "secret-ada", "tun-a")
	if got := describe(tok, err); got != "ada on tun-a, revoked false" {
		t.Fatalf("CreateToken = %s", got)
	}
	if tok.CreatedAt.Before(before) {
		t.Errorf("created %v, before the test began (%v)", tok.CreatedAt, before)
	}
	_, err = db.CreateToken(ctx, "ada", "other", "tun-c")
	wantErr(t, "a second token named ada", err, ErrConflict)
	if err == nil || !strings.Contains(err.Error(), `"ada"`) {
		t.Errorf("the conflict %v does not name the token", err)
	}
	_, err = db.CreateToken(ctx, "ada2", "other", "tun-a")
	wantErr(t, "a second token on tun-a", err, ErrConflict)

	if _, err := db.Writer().ExecContext(ctx, `CREATE TRIGGER no_carol BEFORE INSERT ON tokens WHEN NEW.name = 'carol'
		BEGIN SELECT RAISE(ABORT, 'carol is barred'); END`); err != nil {
		t.Fatal(err)
	}
	_, err = db.CreateToken(ctx, "carol", "secret-c", "tun-c")
	if err == nil || errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "carol is barred") {
		t.Errorf("an insert failing otherwise: err = %v, want the database's error, not ErrConflict", err)
	}
}

// A token authenticates, and keeps its tunnel live, until it is revoked;
// it is revoked once.
func TestRevokeToken(t *testing.T) {
	ctx, db := context.Background(), open(t)
	createTokens(t, db)
	if got := describe(db.Authenticate(ctx, "secret-ada")); got != "ada on tun-a, revoked false" {
		t.Errorf("Authenticate(secret-ada) = %s", got)
	}
	_, err := db.Authenticate(ctx, "wrong")
	wantErr(t, "Authenticate(wrong)", err, ErrNotFound)
	if live, err := db.TunnelLive(ctx, "tun-a"); !live || err != nil {
		t.Errorf("TunnelLive(tun-a) = %v, %v; want true", live, err)
	}
	if live, err := db.TunnelLive(ctx, "tun-x"); live || err != nil {
		t.Errorf("TunnelLive(unknown) = %v, %v; want false", live, err)
	}

	if err := db.RevokeToken(ctx, "ada"); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "revoking twice", db.RevokeToken(ctx, "ada"), ErrNotFound)
	wantErr(t, "revoking an unknown token", db.RevokeToken(ctx, "nobody"), ErrNotFound)
	_, err = db.Authenticate(ctx, "secret-ada")
	wantErr(t, "Authenticate(revoked)", err, ErrNotFound)
	if live, err := db.TunnelLive(ctx, "tun-a"); live || err != nil {
		t.Errorf("TunnelLive(revoked) = %v, %v; want false", live, err)
	}
	revoked, err := db.RevokedTunnels(ctx)
	if err != nil || fmt.Sprint(revoked) != "map[tun-a:true]" {
		t.Errorf("RevokedTunnels = %v, %v; want tun-a only", revoked, err)
	}
}

// Tokens are listed oldest first, revoked or not, with the time of their
// revocation.
func TestTokenLookups(t *testing.T) {
	ctx, db := context.Background(), open(t)
	createTokens(t, db)
	if err := db.RevokeToken(ctx, "ada"); err != nil {
		t.Fatal(err)
	}
	a, err := db.TokenByName(ctx, "ada")
	if got := describe(a, err); got != "ada on tun-a, revoked true" {
		t.Fatalf("TokenByName(ada) = %s", got)
	}
	if a.RevokedAt.Before(a.CreatedAt) {
		t.Errorf("ada revoked at %v, before its creation at %v", a.RevokedAt, a.CreatedAt)
	}
	if got := describe(db.TokenByName(ctx, "bob")); got != "bob on tun-b, revoked false" {
		t.Errorf("TokenByName(bob) = %s", got)
	}
	_, err = db.TokenByName(ctx, "nobody")
	wantErr(t, "TokenByName(unknown)", err, ErrNotFound)
	all, err := db.Tokens(ctx)
	if err != nil || len(all) != 2 {
		t.Fatalf("Tokens = %v, %v; want two", all, err)
	}
	if got := describe(all[0], nil) + "; " + describe(all[1], nil); got != "ada on tun-a, revoked true; bob on tun-b, revoked false" {
		t.Errorf("Tokens = %s", got)
	}
}

// Only the token's hash is kept.
func TestTokenKeptHashed(t *testing.T) {
	ctx, db := context.Background(), open(t)
	if _, err := db.CreateToken(ctx, "ada", "secret-a", "tun-a"); err != nil {
		t.Fatal(err)
	}
	var hash []byte
	if err := db.Reader().QueryRowContext(ctx, `SELECT token_hash FROM tokens`).Scan(&hash); err != nil {
		t.Fatal(err)
	}
	if string(hash) != string(HashToken("secret-a")) {
		t.Errorf("stored %x, want the token's SHA-256", hash)
	}
}

func TestSettings(t *testing.T) {
	ctx, db := context.Background(), open(t)
	if v, err := db.Setting(ctx, "public_url"); v != "" || err != nil {
		t.Errorf("unset setting = %q, %v; want empty", v, err)
	}
	for _, v := range []string{"https://a.example", "https://b.example"} {
		if err := db.SetSetting(ctx, "public_url", v); err != nil {
			t.Fatal(err)
		}
		if got, err := db.Setting(ctx, "public_url"); got != v || err != nil {
			t.Errorf("Setting after setting %q = %q, %v", v, got, err)
		}
	}
}

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// enqueueFour queues r0..r3, r1 on t2 and the others on t1; ri arrives at
// t0+i s, its URI is i bytes longer than "/hook" and its body is 10*i
// bytes.
func enqueueFour(t *testing.T, db *Store) []*QueuedRequest {
	t.Helper()
	var reqs []*QueuedRequest
	for i, tun := range []string{"t1", "t2", "t1", "t1"} {
		r := &QueuedRequest{
			ID: fmt.Sprintf("r%d", i), TunnelID: tun, ArrivedAt: t0.Add(time.Duration(i) * time.Second).UnixMicro(),
			Method: "POST", URI: "/hook" + strings.Repeat("x", i), Headers: []byte("hh"), Body: []byte(strings.Repeat("b", 10*i)),
		}
		if err := db.Enqueue(context.Background(), r); err != nil {
			t.Fatal(err)
		}
		reqs = append(reqs, r)
	}
	return reqs
}

// size is what the queue counts of enqueueFour's ri: body, headers and URI.
func size(i int) int64 { return int64(10*i + 2 + 5 + i) }

// The queue gives each tunnel's requests back whole, in order, from a
// place on; a request whose id is queued already is refused.
func TestQueuedAfter(t *testing.T) {
	ctx, db := context.Background(), open(t)
	reqs := enqueueFour(t, db)
	dup := &QueuedRequest{ID: "r0", TunnelID: "t1", Method: "GET", URI: "/", Headers: []byte{}, Body: []byte{}}
	if err := db.Enqueue(ctx, dup); err == nil || dup.Seq != 0 {
		t.Errorf("enqueueing a known id: err %v, seq %d; want an error and no place", err, dup.Seq)
	}
	got, err := db.QueuedAfter(ctx, "t1", 0, 10)
	if err != nil || len(got) != 3 {
		t.Fatalf("QueuedAfter(t1) = %d requests, %v; want 3", len(got), err)
	}
	for i, want := range []*QueuedRequest{reqs[0], reqs[2], reqs[3]} {
		if fmt.Sprint(*got[i]) != fmt.Sprint(*want) {
			t.Errorf("queued %d: %+v, want %+v", i, *got[i], *want)
		}
	}
	if got, _ := db.QueuedAfter(ctx, "t1", reqs[0].Seq, 1); len(got) != 1 || got[0].ID != "r2" {
		t.Errorf("QueuedAfter(t1, r0's place, 1) = %v, want r2", got)
	}
}

// Each tunnel's queue is sized; what is dequeued or expired is forgotten.
func TestQueueStatsDequeueExpire(t *testing.T) {
	ctx, db := context.Background(), open(t)
	reqs := enqueueFour(t, db)
	stats, err := db.QueueStatsByTunnel(ctx)
	want := map[string]QueueStats{"t1": {Count: 3, Bytes: size(0) + size(2) + size(3)}, "t2": {Count: 1, Bytes: size(1)}}
	if err != nil || fmt.Sprint(stats) != fmt.Sprint(want) {
		t.Errorf("QueueStatsByTunnel = %v, %v; want %v", stats, err, want)
	}
	if s, err := db.TunnelQueueStats(ctx, "t1"); err != nil || s != want["t1"] {
		t.Errorf("TunnelQueueStats(t1) = %v, %v; want %v", s, err, want["t1"])
	}
	if s, err := db.TunnelQueueStats(ctx, "t9"); err != nil || s != (QueueStats{}) {
		t.Errorf("TunnelQueueStats(empty) = %v, %v; want zero", s, err)
	}

	if err := db.Dequeue(ctx); err != nil {
		t.Errorf("Dequeue of nothing: %v", err)
	}
	if err := db.Dequeue(ctx, reqs[0].Seq, reqs[2].Seq); err != nil {
		t.Fatal(err)
	}
	if got, _ := db.QueuedAfter(ctx, "t1", 0, 10); len(got) != 1 || got[0].ID != "r3" {
		t.Errorf("after dequeueing r0 and r2: %v, want r3", got)
	}
	// Expiry drops what arrived strictly before the cutoff: r1 (t0+1s), not r3 (t0+3s).
	if n, err := db.ExpireQueued(ctx, t0.Add(3*time.Second)); err != nil || n != 1 {
		t.Errorf("ExpireQueued = %d, %v; want 1", n, err)
	}
	left := map[string]QueueStats{"t1": {Count: 1, Bytes: size(3)}}
	if stats, _ := db.QueueStatsByTunnel(ctx); fmt.Sprint(stats) != fmt.Sprint(left) {
		t.Errorf("after expiry: %v, want %v", stats, left)
	}
}
