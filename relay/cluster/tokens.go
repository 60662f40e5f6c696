// Tokens and settings in the calltap_tokens bucket: hash.<sha256 hex> is a
// token's record, name.<name> and tunnel.<id> the hash it goes by,
// setting.<key> a setting.

package cluster

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/calltap/calltap/storage/relaystate"
	"github.com/nats-io/nats.go/jetstream"
)

// tokenStore keeps tokens and settings in calltap_tokens, and mirrors the
// token records so that authenticating costs no round trip.
type tokenStore struct {
	*link
	kv jetstream.KeyValue

	mu       sync.Mutex
	byHash   map[string]*relaystate.Token // guarded by mu; mirror of hash.* in calltap_tokens
	byTunnel map[string]*relaystate.Token // guarded by mu; the same tokens by tunnel id
	revoked  func(tunnelID string)        // guarded by mu; set by Serve
}

func newTokenStore(l *link, kv jetstream.KeyValue) *tokenStore {
	return &tokenStore{link: l, kv: kv, byHash: map[string]*relaystate.Token{}, byTunnel: map[string]*relaystate.Token{}}
}

type tokenRecord struct {
	Name      string     `json:"name"`
	TunnelID  string     `json:"tunnel_id"`
	CreatedAt time.Time  `json:"created_at"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
}

// apply brings a token record of the bucket into the mirror.
func (c *tokenStore) apply(e jetstream.KeyValueEntry) {
	hash := strings.TrimPrefix(e.Key(), "hash.")
	c.mu.Lock()
	defer c.mu.Unlock()
	if e.Operation() != jetstream.KeyValuePut {
		if t := c.byHash[hash]; t != nil {
			delete(c.byTunnel, t.TunnelID)
		}
		delete(c.byHash, hash)
		return
	}
	var r tokenRecord
	if json.Unmarshal(e.Value(), &r) != nil {
		c.log.Warn("unreadable token record in NATS", "key", e.Key())
		return
	}
	t := &relaystate.Token{Name: r.Name, TunnelID: r.TunnelID, CreatedAt: r.CreatedAt, RevokedAt: r.RevokedAt}
	c.byHash[hash] = t
	c.byTunnel[t.TunnelID] = t
	if t.RevokedAt != nil && c.revoked != nil {
		// At once, not at the relay's next look at RevokedTunnels; in its
		// own goroutine, as it waits for the agent to be told.
		go c.revoked(t.TunnelID)
	}
}

func hashKey(token string) string { return hex.EncodeToString(relaystate.HashToken(token)) }

// CreateToken stores a new token for name, bound to tunnelID.
func (c *tokenStore) CreateToken(ctx context.Context, name, token, tunnelID string) (*relaystate.Token, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	h := hashKey(token)
	// The name is claimed first: two nodes creating the same name at once
	// cannot both succeed.
	if _, err := c.kv.Create(ctx, "name."+name, []byte(h)); errors.Is(err, jetstream.ErrKeyExists) {
		return nil, fmt.Errorf("a token named %q exists already: %w", name, relaystate.ErrConflict)
	} else if err != nil {
		return nil, err
	}
	r := tokenRecord{Name: name, TunnelID: tunnelID, CreatedAt: time.Now().UTC()}
	b, _ := json.Marshal(r)
	if _, err := c.kv.Create(ctx, "hash."+h, b); err != nil {
		c.kv.Delete(ctx, "name."+name)
		return nil, err
	}
	if _, err := c.kv.Put(ctx, "tunnel."+tunnelID, []byte(h)); err != nil {
		return nil, err
	}
	t := &relaystate.Token{Name: name, TunnelID: tunnelID, CreatedAt: r.CreatedAt}
	c.mu.Lock()
	c.byHash[h] = t
	c.byTunnel[tunnelID] = t
	c.mu.Unlock()
	return t, nil
}

// Authenticate returns the live token token.
func (c *tokenStore) Authenticate(ctx context.Context, token string) (*relaystate.Token, error) {
	h := hashKey(token)
	c.mu.Lock()
	t := c.byHash[h]
	c.mu.Unlock()
	if t == nil {
		// Created a moment ago elsewhere, and not mirrored yet.
		var err error
		if t, err = c.record(ctx, h); err != nil {
			return nil, err
		}
	}
	if t.RevokedAt != nil {
		return nil, relaystate.ErrNotFound
	}
	cp := *t
	return &cp, nil
}

// Tokens lists every token, oldest first.
func (c *tokenStore) Tokens(ctx context.Context) ([]*relaystate.Token, error) {
	c.mu.Lock()
	out := make([]*relaystate.Token, 0, len(c.byHash))
	for _, t := range c.byHash {
		cp := *t
		out = append(out, &cp)
	}
	c.mu.Unlock()
	slices.SortFunc(out, func(a, b *relaystate.Token) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return out, nil
}

// RevokeToken marks name's token revoked; every node drops its agent on
// seeing it in its mirror.
func (c *tokenStore) RevokeToken(ctx context.Context, name string) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	ne, err := c.kv.Get(ctx, "name."+name)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return relaystate.ErrNotFound
	} else if err != nil {
		return err
	}
	for {
		e, err := c.kv.Get(ctx, "hash."+string(ne.Value()))
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return relaystate.ErrNotFound
		} else if err != nil {
			return err
		}
		var r tokenRecord
		if err := json.Unmarshal(e.Value(), &r); err != nil {
			return err
		}
		if r.RevokedAt != nil {
			return relaystate.ErrNotFound
		}
		now := time.Now().UTC()
		r.RevokedAt = &now
		b, _ := json.Marshal(r)
		if _, err := c.kv.Update(ctx, e.Key(), b, e.Revision()); casMissed(err) {
			continue // changed meanwhile: look again
		} else if err != nil {
			return err
		}
		return nil
	}
}

// record reads the token whose hash is h from the bucket.
func (c *tokenStore) record(ctx context.Context, h string) (*relaystate.Token, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	e, err := c.kv.Get(ctx, "hash."+h)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, relaystate.ErrNotFound
	} else if err != nil {
		return nil, err
	}
	var r tokenRecord
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return nil, err
	}
	return &relaystate.Token{Name: r.Name, TunnelID: r.TunnelID, CreatedAt: r.CreatedAt, RevokedAt: r.RevokedAt}, nil
}

// TunnelLive reports whether a token that is not revoked owns tunnelID.
func (c *tokenStore) TunnelLive(ctx context.Context, tunnelID string) (bool, error) {
	c.mu.Lock()
	t := c.byTunnel[tunnelID]
	c.mu.Unlock()
	if t != nil {
		return t.RevokedAt == nil, nil
	}
	// Perhaps created a moment ago elsewhere, and not mirrored yet.
	tctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	e, err := c.kv.Get(tctx, "tunnel."+tunnelID)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	t, err = c.record(ctx, string(e.Value()))
	if errors.Is(err, relaystate.ErrNotFound) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	return t.RevokedAt == nil, nil
}

// RevokedTunnels returns the tunnel ids of every revoked token.
func (c *tokenStore) RevokedTunnels(context.Context) (map[string]bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]bool{}
	for _, t := range c.byHash {
		if t.RevokedAt != nil {
			out[t.TunnelID] = true
		}
	}
	return out, nil
}

// Setting returns a relay setting, or "" when unset.
func (c *tokenStore) Setting(ctx context.Context, key string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	e, err := c.kv.Get(ctx, "setting."+key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return "", nil
	} else if err != nil {
		return "", err
	}
	return string(e.Value()), nil
}

// SetSetting stores a relay setting.
func (c *tokenStore) SetSetting(ctx context.Context, key, value string) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	_, err := c.kv.Put(ctx, "setting."+key, []byte(value))
	return err
}
