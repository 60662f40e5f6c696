package emulator

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"time"

	"github.com/calltap/calltap/relay/api"
	"github.com/calltap/calltap/storage/servicedb"
)

// Prefix is where the API lives, the documentation's {base_url} path.
const Prefix = "/api/v1/ext"

// Server is the emulated voice service: its API and its delivery scheduler.
type Server struct {
	cfg    Config
	db     *servicedb.Store
	mux    *http.ServeMux
	client *http.Client
	keys   []hashedKey
	secret []byte // signs media links; kept in the database across restarts
	wav    []byte // the recording every completed call has

	// wake nudges the scheduler when a delivery becomes due sooner than it
	// planned (dispatch, replay). Buffered 1; senders never block.
	wake chan struct{}
}

// hashedKey is an API key kept as its SHA-256, so that comparing a
// presented key takes the same time whatever its length.
type hashedKey struct {
	hash [sha256.Size]byte
	key  *Key
}

// New opens (creating) the emulator's database in cfg.DataDir, seeds it
// when asked to, and builds the API. Start the scheduler with Run.
func New(cfg Config) (*Server, error) {
	cfg.setDefaults()
	if cfg.DataDir == "" {
		return nil, errors.New("emulator: no data directory")
	}
	ctx := context.Background()
	db, err := servicedb.Open(ctx, filepath.Join(cfg.DataDir, "service.db"))
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, db: db, mux: http.NewServeMux(), wake: make(chan struct{}, 1), wav: sineWAV()}
	for i := range cfg.Keys {
		k := &s.cfg.Keys[i]
		s.keys = append(s.keys, hashedKey{hash: sha256.Sum256([]byte(k.Key)), key: k})
	}
	fresh := make([]byte, 32)
	rand.Read(fresh)
	secret, err := db.InitServiceSetting(ctx, "media_secret", hex.EncodeToString(fresh))
	if err == nil {
		s.secret, err = hex.DecodeString(secret)
	}
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("emulator: media secret: %w", err)
	}
	if cfg.Seed > 0 {
		if err := s.seed(ctx, cfg.Seed); err != nil {
			db.Close()
			return nil, fmt.Errorf("emulator: seed: %w", err)
		}
	}
	s.client = s.newClient()
	s.routes()
	return s, nil
}

// Close closes the database. Call it after Run has returned.
func (s *Server) Close() error {
	s.client.CloseIdleConnections()
	return s.db.Close()
}

// Handler is the API and the signed media files.
func (s *Server) Handler() http.Handler { return s.mux }

func (s *Server) now() time.Time { return s.cfg.Clock().UTC() }

// scaled shrinks a documented wait by the time scale.
func (s *Server) scaled(d time.Duration) time.Duration {
	return time.Duration(float64(d) * s.cfg.TimeScale)
}

func (s *Server) routes() {
	m := s.mux
	// Patterns carry no method, so that a wrong method gets a 405 in the
	// envelope (after authentication, like everything under the API) and
	// literal segments (replay) win over wildcards ({id}).
	route := func(method, path, scope string, h http.HandlerFunc) {
		m.Handle(Prefix+path, s.auth(scope, method, h))
	}
	route("POST", "/calls/dispatch/{$}", "", s.dispatch)
	route("GET", "/webhooks/{$}", ScopeWebhooksRead, s.listDeliveries)
	route("GET", "/webhooks/{id}/{$}", ScopeWebhooksRead, s.getDelivery)
	route("POST", "/webhooks/replay/{$}", ScopeWebhooksWrite, s.replay)
	route("GET", "/call_logs/{id}/media/{$}", "", s.callMedia)
	route("GET", "/contacts/{$}", "", s.listContacts)
	route("GET", "/contacts/search/{$}", "", s.searchContacts)
	m.Handle(Prefix+"/", s.auth("", "", func(w http.ResponseWriter, r *http.Request) {
		api.WriteError(w, api.NotFound("endpoint "+r.URL.Path))
	}))
	// Signed links carry their own authority; no API key.
	m.HandleFunc("GET "+mediaPrefix+"{call}/{file}", s.mediaFile)
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		api.WriteError(w, api.NotFound("endpoint "+r.URL.Path))
	})
}

// auth requires a known API key (else 401), the method ("": any; else
// 405) and, when scope is set, a key carrying it (else 403).
func (s *Server) auth(scope, method string, next http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k := s.authenticate(r.Header.Get("Authorization"))
		if k == nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="calltap mock-service"`)
			api.WriteError(w, api.Errorf(http.StatusUnauthorized, api.CodeUnauthorized, "missing or unknown API key: send Authorization: Bearer <API_KEY>"))
			return
		}
		if method != "" && r.Method != method {
			w.Header().Set("Allow", method)
			api.WriteError(w, api.Errorf(http.StatusMethodNotAllowed, api.CodeMethod, "%s %s is not allowed; use %s", r.Method, r.URL.Path, method))
			return
		}
		if scope != "" && !k.has(scope) {
			api.WriteError(w, api.Errorf(http.StatusForbidden, api.CodeForbidden, "this API key lacks the %s scope", scope))
			return
		}
		next(w, r)
	})
}

// authenticate returns the key presented in an Authorization header. Every
// configured key is compared, in constant time, so timing tells nothing
// about which key came close.
func (s *Server) authenticate(header string) *Key {
	scheme, token, ok := strings.Cut(strings.TrimSpace(header), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return nil
	}
	h := sha256.Sum256([]byte(strings.TrimSpace(token)))
	var found *Key
	for i := range s.keys {
		if subtle.ConstantTimeCompare(h[:], s.keys[i].hash[:]) == 1 {
			found = s.keys[i].key
		}
	}
	return found
}

// fail writes err in the envelope; an error that is not an *api.Error is
// a fault of ours, logged here because the client sees only "internal".
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	var e *api.Error
	if !errors.As(err, &e) {
		s.cfg.Log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	api.WriteError(w, err)
}

// baseURL is the emulator's own address as a client reaches it.
func (s *Server) baseURL(r *http.Request) string {
	if s.cfg.PublicURL != "" {
		return s.cfg.PublicURL
	}
	if r == nil || r.Host == "" {
		return "http://127.0.0.1"
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

// newClient is the HTTP client of deliveries: bounded in every phase, and
// not following redirects (a 3xx is the target's answer).
func (s *Server) newClient() *http.Client {
	rt := s.cfg.Transport
	if rt == nil {
		rt = &http.Transport{
			Proxy:                 nil, // the service reaches targets directly
			DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			TLSHandshakeTimeout:   5 * time.Second,
			ResponseHeaderTimeout: s.cfg.DeliveryTimeout,
			MaxIdleConnsPerHost:   4,
			IdleConnTimeout:       30 * time.Second,
			ForceAttemptHTTP2:     true,
		}
	}
	return &http.Client{
		Transport: rt,
		Timeout:   s.cfg.DeliveryTimeout,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}
