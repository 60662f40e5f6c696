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
	"time"

	"github.com/calltap/calltap/storage"
	"github.com/nats-io/nats.go/jetstream"
)

func hashKey(token string) string { return hex.EncodeToString(storage.HashToken(token)) }

// CreateToken stores a new token for name, bound to tunnelID.
func (c *Cluster) CreateToken(ctx context.Context, name, token, tunnelID string) (*storage.Token, error) {
	ctx, cancel := context.WithTimeout(ctx, c.opts.RequestTimeout)
	defer cancel()
	h := hashKey(token)
	// The name is claimed first: two nodes creating the same name at once
	// cannot both succeed.
	if _, err := c.tokens.Create(ctx, "name."+name, []byte(h)); errors.Is(err, jetstream.ErrKeyExists) {
		return nil, fmt.Errorf("a token named %q exists already: %w", name, storage.ErrConflict)
	} else if err != nil {
		return nil, err
	}
	r := tokenRecord{Name: name, TunnelID: tunnelID, CreatedAt: time.Now().UTC()}
	b, _ := json.Marshal(r)
	if _, err := c.tokens.Create(ctx, "hash."+h, b); err != nil {
		c.tokens.Delete(ctx, "name."+name)
		return nil, err
	}
	if _, err := c.tokens.Put(ctx, "tunnel."+tunnelID, []byte(h)); err != nil {
		return nil, err
	}
	t := &storage.Token{Name: name, TunnelID: tunnelID, CreatedAt: r.CreatedAt}
	c.mu.Lock()
	c.byHash[h] = t
	c.byTunnel[tunnelID] = t
	c.mu.Unlock()
	return t, nil
}

// Authenticate returns the live token token.
func (c *Cluster) Authenticate(ctx context.Context, token string) (*storage.Token, error) {
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
		return nil, storage.ErrNotFound
	}
	cp := *t
	return &cp, nil
}

// Tokens lists every token, oldest first.
func (c *Cluster) Tokens(ctx context.Context) ([]*storage.Token, error) {
	c.mu.Lock()
	out := make([]*storage.Token, 0, len(c.byHash))
	for _, t := range c.byHash {
		cp := *t
		out = append(out, &cp)
	}
	c.mu.Unlock()
	slices.SortFunc(out, func(a, b *storage.Token) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return out, nil
}

// RevokeToken marks name's token revoked; every node drops its agent on
// seeing it in its mirror.
func (c *Cluster) RevokeToken(ctx context.Context, name string) error {
	ctx, cancel := context.WithTimeout(ctx, c.opts.RequestTimeout)
	defer cancel()
	ne, err := c.tokens.Get(ctx, "name."+name)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return storage.ErrNotFound
	} else if err != nil {
		return err
	}
	for {
		e, err := c.tokens.Get(ctx, "hash."+string(ne.Value()))
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return storage.ErrNotFound
		} else if err != nil {
			return err
		}
		var r tokenRecord
		if err := json.Unmarshal(e.Value(), &r); err != nil {
			return err
		}
		if r.RevokedAt != nil {
			return storage.ErrNotFound
		}
		now := time.Now().UTC()
		r.RevokedAt = &now
		b, _ := json.Marshal(r)
		if _, err := c.tokens.Update(ctx, e.Key(), b, e.Revision()); errors.Is(err, jetstream.ErrKeyExists) {
			continue // changed meanwhile: look again
		} else if err != nil {
			return err
		}
		return nil
	}
}

// record reads the token whose hash is h from the bucket.
func (c *Cluster) record(ctx context.Context, h string) (*storage.Token, error) {
	ctx, cancel := context.WithTimeout(ctx, c.opts.RequestTimeout)
	defer cancel()
	e, err := c.tokens.Get(ctx, "hash."+h)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, storage.ErrNotFound
	} else if err != nil {
		return nil, err
	}
	var r tokenRecord
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return nil, err
	}
	return &storage.Token{Name: r.Name, TunnelID: r.TunnelID, CreatedAt: r.CreatedAt, RevokedAt: r.RevokedAt}, nil
}

// TunnelLive reports whether a token that is not revoked owns tunnelID.
func (c *Cluster) TunnelLive(ctx context.Context, tunnelID string) (bool, error) {
	c.mu.Lock()
	t := c.byTunnel[tunnelID]
	c.mu.Unlock()
	if t != nil {
		return t.RevokedAt == nil, nil
	}
	// Perhaps created a moment ago elsewhere, and not mirrored yet.
	tctx, cancel := context.WithTimeout(ctx, c.opts.RequestTimeout)
	defer cancel()
	e, err := c.tokens.Get(tctx, "tunnel."+tunnelID)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	t, err = c.record(ctx, string(e.Value()))
	if errors.Is(err, storage.ErrNotFound) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	return t.RevokedAt == nil, nil
}

// RevokedTunnels returns the tunnel ids of every revoked token.
func (c *Cluster) RevokedTunnels(context.Context) (map[string]bool, error) {
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
func (c *Cluster) Setting(ctx context.Context, key string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, c.opts.RequestTimeout)
	defer cancel()
	e, err := c.tokens.Get(ctx, "setting."+key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return "", nil
	} else if err != nil {
		return "", err
	}
	return string(e.Value()), nil
}

// SetSetting stores a relay setting.
func (c *Cluster) SetSetting(ctx context.Context, key, value string) error {
	ctx, cancel := context.WithTimeout(ctx, c.opts.RequestTimeout)
	defer cancel()
	_, err := c.tokens.Put(ctx, "setting."+key, []byte(value))
	return err
}
