// Package emulatortest runs the voice service emulator for tests: on its
// own 127.0.0.1:0 socket, with its data in the test's temporary directory,
// its scheduler running, and everything stopped when the test ends.
package emulatortest

import (
	"context"
	"errors"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/calltap/calltap/inspector/voice/emulator"
)

// API keys every emulator started here accepts.
const (
	Key     = "test_key" // webhooks:read and webhooks:write
	ReadKey = "ro_key"   // webhooks:read
	BareKey = "bare_key" // no scope
)

// TimeScale is the default time scale: the documented waits shrink a
// thousandfold, so a call's events and retries come within a test.
const TimeScale = 0.001

// Emulator is a running emulator.
type Emulator struct {
	Server *emulator.Server
	Config emulator.Config // as started, PublicURL filled in
	URL    string          // http://127.0.0.1:port
	Base   string          // URL + emulator.Prefix + "/": the base a client of its API is given
}

// Start starts an emulator that accepts Key, ReadKey and BareKey, scales
// time by TimeScale, delivers to http targets and gives an attempt five
// seconds. edit, if not nil, changes that configuration first; wrap, if not
// nil, is given the emulator's handler and returns the one served, for a
// test that watches or answers for the API.
func Start(t testing.TB, edit func(*emulator.Config), wrap func(http.Handler) http.Handler) *Emulator {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := emulator.Config{
		Keys: []emulator.Key{
			{Key: Key, Scopes: []string{emulator.ScopeWebhooksRead, emulator.ScopeWebhooksWrite}},
			{Key: ReadKey, Scopes: []string{emulator.ScopeWebhooksRead}},
			{Key: BareKey},
		},
		DataDir:           t.TempDir(),
		TimeScale:         TimeScale,
		AllowHTTPWebhooks: true,
		DeliveryTimeout:   5 * time.Second,
		PublicURL:         "http://" + ln.Addr().String(),
	}
	if edit != nil {
		edit(&cfg)
	}
	srv, err := emulator.New(cfg)
	if err != nil {
		ln.Close()
		t.Fatal(err)
	}
	h := srv.Handler()
	if wrap != nil {
		h = wrap(h)
	}
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go hs.Serve(ln)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		// A test that ends at once may stop Run before it starts.
		if err := <-ran; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("emulator Run: %v", err)
		}
		hs.Close()
		srv.Close()
	})
	return &Emulator{Server: srv, Config: cfg, URL: cfg.PublicURL, Base: cfg.PublicURL + emulator.Prefix + "/"}
}
