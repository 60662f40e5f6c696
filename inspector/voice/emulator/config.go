package emulator

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"
)

// Scopes. The documentation names the two webhook scopes (spelt there with
// a space after the colon, which is accepted and dropped).
const (
	ScopeWebhooksRead  = "webhooks:read"  // GET /webhooks/, GET /webhooks/{id}/
	ScopeWebhooksWrite = "webhooks:write" // POST /webhooks/replay/
)

// Key is an API key and the scopes it carries.
type Key struct {
	Key    string
	Scopes []string
}

// has reports whether k carries scope.
func (k *Key) has(scope string) bool {
	for _, s := range k.Scopes {
		if s == scope {
			return true
		}
	}
	return false
}

// ParseKey reads "key=scope,scope" (or a bare "key", which carries no
// scope: it may dispatch calls and read contacts and media, nothing else).
func ParseKey(spec string) (Key, error) {
	spec = strings.TrimSpace(spec)
	name, scopes, _ := strings.Cut(spec, "=")
	name = strings.TrimSpace(name)
	if name == "" {
		return Key{}, fmt.Errorf("api key %q: want key=scope,scope", spec)
	}
	if strings.ContainsAny(name, " \t") {
		return Key{}, fmt.Errorf("api key %q: a key has no spaces", spec)
	}
	k := Key{Key: name}
	for _, s := range strings.Split(scopes, ",") {
		s = strings.ReplaceAll(strings.TrimSpace(s), " ", "")
		if s != "" {
			k.Scopes = append(k.Scopes, s)
		}
	}
	return k, nil
}

// ParseKeys reads a keys file: one "key=scope,scope" a line; blank lines
// and lines starting with # are skipped.
func ParseKeys(r io.Reader) ([]Key, error) {
	var keys []Key
	sc := bufio.NewScanner(r)
	line := 0
	for sc.Scan() {
		line++
		s := strings.TrimSpace(sc.Text())
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		k, err := ParseKey(s)
		if err != nil {
			return nil, fmt.Errorf("line %d: %v", line, err)
		}
		keys = append(keys, k)
	}
	return keys, sc.Err()
}

// Config configures the emulator.
type Config struct {
	// Keys are the API keys accepted in "Authorization: Bearer <key>".
	Keys []Key
	// DataDir holds service.db, the emulator's state.
	DataDir string
	// TimeScale multiplies every wait: event timings and the retry
	// schedule. 0 means 1 (real time); 0.01 runs a call 100 times faster.
	TimeScale float64
	// AllowHTTPWebhooks admits http:// webhook URLs whose host is loopback
	// (for tests and local handlers); https is required otherwise.
	AllowHTTPWebhooks bool
	// DeliveryTimeout bounds one delivery attempt; 0 means 10 s.
	DeliveryTimeout time.Duration
	// MediaExpiresIn is the lifetime of signed media links; 0 means one
	// hour. It is not scaled by TimeScale: a link is for a person or a
	// handler to fetch, in real time.
	MediaExpiresIn time.Duration
	// Seed, when the database has no contacts, creates this many contacts
	// and as many past calls with their deliveries.
	Seed int
	// PublicURL is the emulator's own base URL (http://127.0.0.1:9090),
	// used in media links. Empty: taken from the request's Host, and
	// http://127.0.0.1 for seeded calls.
	PublicURL string
	// Workers bounds concurrent delivery attempts; 0 means 8.
	Workers int
	// Clock returns the current time; nil means time.Now. Waiting uses
	// real timers, so a test clock must move with real time (an offset).
	Clock func() time.Time
	// Transport delivers webhooks; nil means an http.Transport of our own.
	Transport http.RoundTripper
	// Log receives one line per delivery attempt; nil discards.
	Log *slog.Logger
}

func (c *Config) setDefaults() {
	if c.TimeScale <= 0 {
		c.TimeScale = 1
	}
	if c.DeliveryTimeout <= 0 {
		c.DeliveryTimeout = 10 * time.Second
	}
	if c.MediaExpiresIn <= 0 {
		c.MediaExpiresIn = time.Hour
	}
	if c.Workers <= 0 {
		c.Workers = 8
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	c.PublicURL = strings.TrimRight(c.PublicURL, "/")
}
