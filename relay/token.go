package relay

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/calltap/calltap/storage/relaystate"
)

// TokenInfo is what `calltap relay token create` prints.
type TokenInfo struct {
	Name     string `json:"name"`
	Token    string `json:"token"`
	TunnelID string `json:"tunnel_id"`
	URL      string `json:"url"`
}

// settingPublicURL is where a relay remembers its public URL, so the token
// command, run beside it, can print tunnel URLs.
const settingPublicURL = "public_url"

// TokenStore is where tokens are minted, listed and revoked, and where the
// relay's settings live: its SQLite file (storage/relaydb) or its
// cluster (relay/cluster).
type TokenStore interface {
	CreateToken(ctx context.Context, name, token, tunnelID string) (*relaystate.Token, error)
	Tokens(ctx context.Context) ([]*relaystate.Token, error)
	RevokeToken(ctx context.Context, name string) error
	Setting(ctx context.Context, key string) (string, error)
	SetSetting(ctx context.Context, key, value string) error
}

// SetPublicURL remembers the relay's public URL in its database.
func SetPublicURL(ctx context.Context, db TokenStore, u string) error {
	return db.SetSetting(ctx, settingPublicURL, strings.TrimRight(u, "/"))
}

// PublicURLOf returns the public URL the relay last ran with ("" if never).
func PublicURLOf(ctx context.Context, db TokenStore) (string, error) {
	return db.Setting(ctx, settingPublicURL)
}

// NewTunnelID draws a tunnel id: 128 random bits, lower-case hex.
func NewTunnelID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// CreateToken mints a token for name bound to a new tunnel id. The token is
// returned once; only its hash is stored.
func CreateToken(ctx context.Context, db TokenStore, name, publicURL string) (*TokenInfo, error) {
	if !validName(name) {
		return nil, fmt.Errorf("token name %q: use 1-64 letters, digits, '.', '_' or '-'", name)
	}
	var b [32]byte
	rand.Read(b[:])
	token := "ct_" + base64.RawURLEncoding.EncodeToString(b[:])
	tunnelID := NewTunnelID()
	if _, err := db.CreateToken(ctx, name, token, tunnelID); err != nil {
		return nil, err
	}
	return &TokenInfo{Name: name, Token: token, TunnelID: tunnelID, URL: tunnelURL(publicURL, tunnelID)}, nil
}

// EnsureToken returns the token named name, creating it if needed; for
// `calltap dev`, which keeps one local token so its URL stays the same.
// The plain token is kept by the caller (dev stores it beside its data).
func EnsureToken(ctx context.Context, db interface {
	TokenStore
	Authenticate(ctx context.Context, token string) (*relaystate.Token, error)
}, name, token string) (*relaystate.Token, error) {
	if t, err := db.Authenticate(ctx, token); err == nil {
		return t, nil
	} else if !errors.Is(err, relaystate.ErrNotFound) {
		return nil, err
	}
	return db.CreateToken(ctx, name, token, NewTunnelID())
}

func tunnelURL(publicURL, tunnelID string) string {
	if publicURL == "" {
		return "/t/" + tunnelID
	}
	return strings.TrimRight(publicURL, "/") + "/t/" + tunnelID
}

func validName(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}
