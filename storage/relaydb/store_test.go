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
	db, err := Open(context.Background(), filepath.Join(t.TempDir(), "relay.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// A token authenticates until it is revoked; its name and its tunnel stay
// taken after that; a second token of the same name is refused.
func TestTokenLife(t *testing.T) {
	ctx, db := context.Background(), open(t)
	before := time.Now().UTC()
	tok, err := db.CreateToken(ctx, "ada", "secret-a", "tun-a")
	if err != nil {
		t.Fatal(err)
	}
	if tok.Name != "ada" || tok.TunnelID != "tun-a" || tok.CreatedAt.Before(before.Truncate(time.Microsecond)) || tok.RevokedAt != nil {
		t.Errorf("CreateToken = %+v", tok)
	}
	if _, err := db.CreateToken(ctx, "bob", "secret-b", "tun-b"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.CreateToken(ctx, "ada", "other", "tun-c"); !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), `"ada"`) {
		t.Errorf("a second token named ada: err = %v, want ErrConflict naming it", err)
	}
	// An insert that fails for another reason is not called a conflict.
	if _, err := db.Writer().ExecContext(ctx, `CREATE TRIGGER no_carol BEFORE INSERT ON tokens WHEN NEW.name = 'carol' BEGIN SELECT RAISE(ABORT, 'carol is barred'); END`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.CreateToken(ctx, "carol", "secret-c", "tun-c"); err == nil || errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "carol is barred") {
		t.Errorf("an insert failing otherwise: err = %v, want the database's error, not ErrConflict", err)
	}

	got, err := db.Authenticate(ctx, "secret-a")
	if err != nil || got.Name != "ada" || got.TunnelID != "tun-a" || !got.CreatedAt.Equal(tok.CreatedAt.Truncate(time.Microsecond)) {
		t.Errorf("Authenticate(secret-a) = %+v, %v", got, err)
	}
	if _, err := db.Authenticate(ctx, "wrong"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Authenticate(wrong) err = %v, want ErrNotFound", err)
	}
	if live, err := db.TunnelLive(ctx, "tun-a"); !live || err != nil {
		t.Errorf("TunnelLive(tun-a) = %v, %v; want true", live, err)
	}
	if live, err := db.TunnelLive(ctx, "tun-x"); live || err != nil {
		t.Errorf("TunnelLive(unknown) = %v, %v; want false", live, err)
	}

	if err := db.RevokeToken(ctx, "ada"); err != nil {
		t.Fatal(err)
	}
	if err := db.RevokeToken(ctx, "ada"); !errors.Is(err, ErrNotFound) {
		t.Errorf("revoking twice: err = %v, want ErrNotFound", err)
	}
	if err := db.RevokeToken(ctx, "nobody"); !errors.Is(err, ErrNotFound) {
		t.Errorf("revoking an unknown token: err = %v, want ErrNotFound", err)
	}
	if _, err := db.Authenticate(ctx, "secret-a"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Authenticate(revoked) err = %v, want ErrNotFound", err)
	}
	if live, err := db.TunnelLive(ctx, "tun-a"); live || err != nil {
		t.Errorf("TunnelLive(revoked) = %v, %v; want false", live, err)
	}
	if _, err := db.CreateToken(ctx, "ada2", "secret-a2", "tun-a"); !errors.Is(err, ErrConflict) {
		t.Errorf("reusing a revoked token's tunnel: err = %v, want ErrConflict", err)
	}
	revoked, err := db.RevokedTunnels(ctx)
	if err != nil || fmt.Sprint(revoked) != "map[tun-a:true]" {
		t.Errorf("RevokedTunnels = %v, %v; want tun-a only", revoked, err)
	}

	a, err := db.TokenByName(ctx, "ada")
	if err != nil || a.RevokedAt == nil || a.RevokedAt.Before(a.CreatedAt) || a.TunnelID != "tun-a" {
		t.Errorf("TokenByName(ada) = %+v, %v; want it revoked", a, err)
	}
	if b, err := db.TokenByName(ctx, "bob"); err != nil || b.RevokedAt != nil || b.TunnelID != "tun-b" {
		t.Errorf("TokenByName(bob) = %+v, %v; want it live", b, err)
	}
	if _, err := db.TokenByName(ctx, "nobody"); !errors.Is(err, ErrNotFound) {
		t.Errorf("TokenByName(unknown) err = %v, want ErrNotFound", err)
	}
	all, err := db.Tokens(ctx)
	if err != nil || len(all) != 2 || all[0].Name != "ada" || all[1].Name != "bob" {
		t.Errorf("Tokens = %v, %v; want ada, bob", all, err)
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

// The queue gives each tunnel's requests back in order, from a place on,
// sizes each tunnel's queue, and forgets what is dequeued or expired.
func TestQueue(t *testing.T) {
	ctx, db := context.Background(), open(t)
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	var reqs []*QueuedRequest
	for i, tun := range []string{"t1", "t2", "t1", "t1"} {
		r := &QueuedRequest{
			ID: fmt.Sprintf("r%d", i), TunnelID: tun, ArrivedAt: t0.Add(time.Duration(i) * time.Second).UnixMicro(),
			Method: "POST", URI: "/hook" + strings.Repeat("x", i), Headers: []byte("hh"), Body: []byte(strings.Repeat("b", 10*i)),
		}
		if err := db.Enqueue(ctx, r); err != nil {
			t.Fatal(err)
		}
		reqs = append(reqs, r)
	}
	// A request with an id already queued is refused, and gets no place.
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
	// size = body + headers + URI
	size := func(i int) int64 { return int64(10*i + 2 + 5 + i) }
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
	n, err := db.ExpireQueued(ctx, t0.Add(3*time.Second))
	if err != nil || n != 1 {
		t.Errorf("ExpireQueued = %d, %v; want 1", n, err)
	}
	if stats, _ := db.QueueStatsByTunnel(ctx); fmt.Sprint(stats) != fmt.Sprint(map[string]QueueStats{"t1": {Count: 1, Bytes: size(3)}}) {
		t.Errorf("after expiry: %v, want t1 with r3 only", stats)
	}
}
