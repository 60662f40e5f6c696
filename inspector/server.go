// Package inspector serves calltap's local JSON API and browser UI over what
// the agent (package agent) captured; knowledge of the voice service lives
// beneath it, in voice/.
package inspector

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/calltap/calltap/inspector/agent"
	"github.com/calltap/calltap/relay/api"
	"github.com/calltap/calltap/storage"
	"github.com/calltap/calltap/storage/agentdb"
)

// ServerConfig configures the inspector's HTTP side.
type ServerConfig struct {
	Agent   *agent.Agent
	Assets  http.Handler // the embedded browser UI, served at /
	Version string       // calltap's, named in HAR exports

	// AllowedHosts are extra Host names accepted besides localhost,
	// 127.0.0.1 and [::1] (--inspect-host): anything else is refused, so a
	// DNS-rebinding page cannot read captures. An entry may instead be a
	// whole origin (https://inspector.example.com, for an inspector behind a
	// proxy): its host is accepted, and the origin exactly as given.
	AllowedHosts []string
	// Token, when set, is required on every request (--inspect-token); it
	// must be set when listening beyond loopback.
	Token string
	// Routes lets packages beneath inspector add their endpoints.
	Routes []func(*http.ServeMux)
}

// Server is the inspector's JSON API and UI. It starts no goroutine of its
// own: its work is done on net/http's, for each request, and the agent's
// Run owns background work such as replays on the service's schedule.
type Server struct {
	cfg     ServerConfig
	agent   *agent.Agent
	mux     *http.ServeMux
	hub     *hub
	hosts   map[string]bool
	origins map[string]bool // accepted whole, besides the inspector's own
}

// NewServer builds the handler and has the agent tell it what happens, for
// the live stream.
func NewServer(cfg ServerConfig) *Server {
	s := &Server{cfg: cfg, agent: cfg.Agent, mux: http.NewServeMux(), hub: newHub(),
		hosts: map[string]bool{"localhost": true, "127.0.0.1": true, "::1": true}, origins: map[string]bool{}}
	cfg.Agent.OnEvent(s.publish)
	for _, h := range cfg.AllowedHosts {
		if !strings.Contains(h, "://") {
			s.hosts[strings.ToLower(strings.Trim(h, "[]"))] = true
			continue
		}
		if u, err := parseOrigin(h); err == nil {
			s.hosts[strings.ToLower(u.Hostname())] = true
			s.origins[u.String()] = true
		}
	}
	m := s.mux
	m.HandleFunc("GET /api/v1/ext/webhooks/", s.listCaptures)
	m.HandleFunc("GET /api/v1/ext/webhooks/{id}/", s.getCapture)
	m.HandleFunc("GET /api/v1/ext/webhooks/{id}/body", s.getBody)
	m.HandleFunc("POST /api/v1/ext/webhooks/replay/", s.replay)
	m.HandleFunc("GET /api/v1/ext/tunnel/", s.tunnel)
	m.HandleFunc("GET /api/tunnels", s.ngrokTunnels)
	m.HandleFunc("GET /api/v1/ext/stream", s.stream)
	m.HandleFunc("GET /api/v1/ext/export", s.export)
	m.HandleFunc("POST /api/v1/ext/calls/{call_id}/replay/", s.replayCall)
	acfg := cfg.Agent.Config()
	CallRoutes(m, acfg.Store, acfg.AnalysisPendingAfter)
	DeleteRoutes(m, acfg.Store)
	if acfg.MediaDir != "" {
		MediaRoutes(m, acfg.Store, acfg.MediaDir)
	}
	for _, r := range cfg.Routes {
		r(m)
	}
	m.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) { api.WriteError(w, api.NotFound("endpoint")) })
	if cfg.Assets != nil {
		m.Handle("/", cfg.Assets)
	}
	return s
}

// publish passes an agent's event on to the live stream's subscribers.
func (s *Server) publish(ev agent.Event) {
	if !s.hub.active() {
		return // spares rendering it
	}
	switch {
	case ev.Capture != nil:
		s.hub.publish("capture", SummaryOf(ev.Capture))
	case ev.Media != nil:
		s.hub.publish("media", MediaFileOf(ev.Media))
	case ev.Tunnel != nil:
		s.hub.publish("tunnel", *ev.Tunnel)
	}
}

// ServeHTTP checks Host, Origin and the token before routing.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !s.hostAllowed(r.Host) {
		api.WriteError(w, api.Errorf(http.StatusForbidden, api.CodeForbidden, "host %q is not allowed; add it with --inspect-host", r.Host))
		return
	}
	stateChanging := r.Method != http.MethodGet && r.Method != http.MethodHead && r.Method != http.MethodOptions
	if origin := r.Header.Get("Origin"); origin != "" && (stateChanging || isUpgrade(r) || strings.HasPrefix(r.URL.Path, "/api/")) {
		if !s.originAllowed(r, origin) {
			api.WriteError(w, api.Errorf(http.StatusForbidden, api.CodeForbidden, "origin %q is not allowed", origin))
			return
		}
	}
	if s.cfg.Token != "" && !s.authorized(w, r) {
		return
	}
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Frame-Options", "DENY")
	if strings.HasPrefix(r.URL.Path, "/api/") && r.URL.Path != "/api/v1/ext/stream" {
		// What the API shows includes every response already sent back.
		s.agent.Settle(r.Context())
	}
	s.mux.ServeHTTP(w, r)
}

func isUpgrade(r *http.Request) bool { return r.Header.Get("Upgrade") != "" }

func (s *Server) hostAllowed(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.ToLower(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"))
	return s.hosts[host]
}

// originAllowed reports whether origin is the inspector's own: its scheme
// (http; https when served over TLS), a host name it accepts, and the port
// it listens on, so that no other page on the same machine — another port
// of localhost — can act through the user's browser. An origin given whole
// in AllowedHosts is accepted as well.
func (s *Server) originAllowed(r *http.Request, origin string) bool {
	u, err := parseOrigin(origin)
	if err != nil {
		return false // "null" among them: a sandboxed page, a file, a redirect
	}
	if s.origins[u.String()] {
		return true
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return u.Scheme == scheme && s.hostAllowed(u.Host) && portOf(u.Host, scheme) == listenPort(r, scheme)
}

// parseOrigin reads an origin (scheme://host[:port], nothing more) in the
// form browsers send: lower case, without the scheme's default port.
func parseOrigin(origin string) (*url.URL, error) {
	u, err := url.Parse(strings.TrimSuffix(origin, "/"))
	if err != nil {
		return nil, err
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.Path != "" || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("origin %q: want http(s)://host[:port]", origin)
	}
	u.Scheme = strings.ToLower(u.Scheme)
	u.Host = strings.ToLower(u.Host)
	if u.Port() == defaultPort(u.Scheme) {
		u.Host = strings.TrimSuffix(u.Host, ":"+u.Port())
	}
	return u, nil
}

// ValidInspectHost checks an --inspect-host value: a host name, or an origin.
func ValidInspectHost(h string) error {
	if !strings.Contains(h, "://") {
		if h == "" || strings.Contains(h, "/") || (strings.Contains(h, ":") && net.ParseIP(strings.Trim(h, "[]")) == nil) {
			return fmt.Errorf("%q: want a host name, or an origin such as https://inspector.example.com", h)
		}
		return nil
	}
	_, err := parseOrigin(h)
	return err
}

func defaultPort(scheme string) string {
	if scheme == "https" {
		return "443"
	}
	return "80"
}

// portOf is the port of host[:port], or the scheme's default.
func portOf(hostport, scheme string) string {
	if _, p, err := net.SplitHostPort(hostport); err == nil && p != "" {
		return p
	}
	return defaultPort(scheme)
}

// listenPort is the port the inspector received r on; without a listener
// (a handler called directly), the port r was addressed to.
func listenPort(r *http.Request, scheme string) string {
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		if _, p, err := net.SplitHostPort(a.String()); err == nil {
			return p
		}
	}
	return portOf(r.Host, scheme)
}

// authorized accepts the token as a bearer header or a cookie; a GET with
// ?token= sets the cookie, so the inspector URL can be opened once with it.
func (s *Server) authorized(w http.ResponseWriter, r *http.Request) bool {
	want := []byte(s.cfg.Token)
	if t := r.URL.Query().Get("token"); t != "" && subtle.ConstantTimeCompare([]byte(t), want) == 1 {
		http.SetCookie(w, &http.Cookie{Name: "calltap_token", Value: t, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
		q := r.URL.Query()
		q.Del("token")
		u := *r.URL
		u.RawQuery = q.Encode()
		http.Redirect(w, r, u.RequestURI(), http.StatusSeeOther)
		return false
	}
	if b, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && subtle.ConstantTimeCompare([]byte(b), want) == 1 {
		return true
	}
	if c, err := r.Cookie("calltap_token"); err == nil && subtle.ConstantTimeCompare([]byte(c.Value), want) == 1 {
		return true
	}
	api.WriteError(w, api.Errorf(http.StatusUnauthorized, api.CodeUnauthorized, "this inspector needs its token: open it with ?token=… or send Authorization: Bearer …"))
	return false
}

// ParseCaptureFilter reads the list filters from a query string.
func ParseCaptureFilter(q url.Values) (agentdb.CaptureFilter, error) {
	var f agentdb.CaptureFilter
	var err error
	if f.Limit, f.Offset, err = api.ParsePage(q); err != nil {
		return f, err
	}
	f.Event, f.CallID, f.DeliveryID, f.Text, f.Source = q.Get("event"), q.Get("call_id"), q.Get("delivery_id"), q.Get("q"), q.Get("source")
	f.Route = q.Get("route")
	switch sc := q.Get("status_class"); sc {
	case "", "none", "1xx", "2xx", "3xx", "4xx", "5xx":
		f.StatusClass = sc
	default:
		return f, api.Invalid("status_class must be one of 2xx, 3xx, 4xx, 5xx, none")
	}
	for _, p := range []struct {
		name string
		dst  *time.Time
	}{{"since", &f.Since}, {"until", &f.Until}} {
		if v := q.Get(p.name); v != "" {
			t, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				return f, api.Invalid("%s must be an RFC 3339 time such as 2026-11-22T10:00:00Z", p.name)
			}
			*p.dst = t
		}
	}
	if v := q.Get("duplicate"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return f, api.Invalid("duplicate must be true or false")
		}
		f.Duplicate = &b
	}
	return f, nil
}

func (s *Server) listCaptures(w http.ResponseWriter, r *http.Request) {
	f, err := ParseCaptureFilter(r.URL.Query())
	if err != nil {
		api.WriteError(w, err)
		return
	}
	rows, count, err := s.agent.Store().Captures(r.Context(), f)
	if err != nil {
		api.WriteError(w, err)
		return
	}
	out := make([]Summary, len(rows))
	for i, c := range rows {
		out[i] = SummaryOf(c)
	}
	api.WriteData(w, http.StatusOK, "ok", api.NewPage(count, len(out), f.Offset, out))
}

// CaptureDetail loads one capture from db with its attempts and replays.
func CaptureDetail(ctx context.Context, db *agentdb.AgentStore, id string) (*Detail, error) {
	c, err := db.Capture(ctx, id)
	if errors.Is(err, storage.ErrNotFound) {
		return nil, api.NotFound("capture " + id)
	} else if err != nil {
		return nil, err
	}
	attempts, err := db.Attempts(ctx, id)
	if err != nil {
		return nil, err
	}
	replays, _, err := db.Captures(ctx, agentdb.CaptureFilter{ReplayOf: id, Page: storage.Page{Limit: api.MaxLimit}})
	if err != nil {
		return nil, err
	}
	d := detailOf(c, attempts, replays)
	d.Checks = checksOf(c)
	return &d, nil
}

func (s *Server) getCapture(w http.ResponseWriter, r *http.Request) {
	d, err := CaptureDetail(r.Context(), s.agent.Store(), r.PathValue("id"))
	if err != nil {
		api.WriteError(w, err)
		return
	}
	api.WriteData(w, http.StatusOK, "ok", d)
}

func (s *Server) getBody(w http.ResponseWriter, r *http.Request) {
	c, err := s.agent.Store().Capture(r.Context(), r.PathValue("id"))
	if errors.Is(err, storage.ErrNotFound) {
		api.WriteError(w, api.NotFound("capture"))
		return
	} else if err != nil {
		api.WriteError(w, err)
		return
	}
	// Served as an opaque download, never rendered: the body is hostile.
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", fmt.Sprintf(`attachment; filename="%s.body"`, c.ID))
	w.Header().Set("Content-Length", strconv.Itoa(len(c.Body)))
	w.Write(c.Body)
}

func (s *Server) replay(w http.ResponseWriter, r *http.Request) {
	var o agent.ReplayOptions
	if err := api.DecodeJSON(w, r, 16<<20, &o); err != nil {
		api.WriteError(w, err)
		return
	}
	if o.ID == "" {
		api.WriteError(w, api.Invalid("id is required"))
		return
	}
	// The id a person pastes: a capture id, a prefix of one or a delivery
	// id, whose original is replayed (as calltap replay does).
	ref, err := ResolveCapture(r.Context(), s.agent.Store(), o.ID)
	if err != nil {
		api.WriteError(w, err)
		return
	}
	o.ID = ref.Original().ID
	c, err := s.agent.Replay(r.Context(), o)
	if err != nil {
		api.WriteError(w, err)
		return
	}
	api.WriteData(w, http.StatusOK, "replayed", ReplayStatus(c, o.Retry == "service"))
}

// export downloads the captures the list's filters select (limit and
// offset aside), oldest first, as JSON Lines (format=jsonl, the default) or
// HAR (format=har).
func (s *Server) export(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f, err := ParseCaptureFilter(q)
	if err != nil {
		api.WriteError(w, err)
		return
	}
	format := q.Get("format")
	if format == "" {
		format = "jsonl"
	}
	if format != "jsonl" && format != "har" {
		api.WriteError(w, api.Invalid("format must be jsonl or har"))
		return
	}
	db := s.agent.Store()
	if first, err := db.CapturesAfter(r.Context(), f, 0, 1); err != nil {
		api.WriteError(w, err)
		return
	} else if len(first) == 0 {
		api.WriteError(w, api.Errorf(http.StatusNotFound, api.CodeNotFound, "no capture matches: nothing to export"))
		return
	}
	name := "calltap-" + time.Now().UTC().Format("20060102-150405")
	if format == "har" {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Disposition", `attachment; filename="`+name+`.har"`)
		ExportHAR(r.Context(), db, ExportOptions{Filter: f, Mask: SecretHeaders()}, s.cfg.Version, w)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Content-Disposition", `attachment; filename="`+name+`.jsonl"`)
	Export(r.Context(), db, ExportOptions{Filter: f, Mask: SecretHeaders()}, w)
}

// replayCall re-fires a whole call in the background: {"to"?, "time_scale"?
// (1: as the events first arrived; 0: back to back), "with_retries"?}.
func (s *Server) replayCall(w http.ResponseWriter, r *http.Request) {
	var body struct {
		To          string   `json:"to"`
		TimeScale   *float64 `json:"time_scale"`
		WithRetries bool     `json:"with_retries"`
	}
	if r.ContentLength != 0 {
		if err := api.DecodeJSON(w, r, 64<<10, &body); err != nil {
			api.WriteError(w, err)
			return
		}
	}
	o := agent.CallReplayOptions{CallID: r.PathValue("call_id"), To: body.To, TimeScale: 1, WithRetries: body.WithRetries}
	if body.TimeScale != nil {
		if *body.TimeScale < 0 {
			api.WriteError(w, api.Invalid("time_scale must not be negative"))
			return
		}
		o.TimeScale = *body.TimeScale
	}
	n, err := s.agent.ReplayCallInBackground(r.Context(), o)
	if err != nil {
		api.WriteError(w, err)
		return
	}
	api.WriteData(w, http.StatusAccepted, "replaying the call", map[string]any{"call_id": o.CallID, "count": n, "queued": true})
}

func (s *Server) tunnel(w http.ResponseWriter, r *http.Request) {
	api.WriteData(w, http.StatusOK, "ok", s.agent.TunnelState())
}

// ngrokTunnels answers in the shape of ngrok's agent API, so scripts that
// read the public URL from http://127.0.0.1:4040/api/tunnels keep working.
func (s *Server) ngrokTunnels(w http.ResponseWriter, r *http.Request) {
	st := s.agent.TunnelState()
	type cfg struct {
		Addr    string `json:"addr"`
		Inspect bool   `json:"inspect"`
	}
	type tun struct {
		Name      string `json:"name"`
		URI       string `json:"uri"`
		PublicURL string `json:"public_url"`
		Proto     string `json:"proto"`
		Config    cfg    `json:"config"`
	}
	proto := "http"
	if strings.HasPrefix(st.PublicURL, "https:") {
		proto = "https"
	}
	tunnels := []tun{}
	if st.PublicURL != "" {
		tunnels = append(tunnels, tun{Name: "calltap", URI: "/api/tunnels/calltap", PublicURL: st.PublicURL, Proto: proto, Config: cfg{Addr: st.ForwardTo, Inspect: true}})
	}
	writeJSON(w, map[string]any{"tunnels": tunnels, "uri": "/api/tunnels"})
}

// stream is the live feed for the UI (server-sent events).
func (s *Server) stream(w http.ResponseWriter, r *http.Request) {
	fl, ok := w.(http.Flusher)
	if !ok {
		api.WriteError(w, api.Errorf(http.StatusInternalServerError, api.CodeInternal, "streaming unsupported"))
		return
	}
	sub := s.hub.subscribe()
	defer s.hub.unsubscribe(sub)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	writeEvent(w, "tunnel", mustJSON(s.agent.TunnelState()))
	fl.Flush()
	keepalive := time.NewTicker(15 * time.Second)
	defer keepalive.Stop()
	for {
		select {
		case ev := <-sub.ch:
			writeEvent(w, ev.name, ev.data)
			// Send what else is waiting before flushing: one write for a burst.
			for n := len(sub.ch); n > 0; n-- {
				ev := <-sub.ch
				writeEvent(w, ev.name, ev.data)
			}
			fl.Flush()
		case <-keepalive.C:
			fmt.Fprint(w, ": keepalive\n\n")
			fl.Flush()
		case <-r.Context().Done():
			return
		}
	}
}

func writeEvent(w http.ResponseWriter, name string, data []byte) {
	fmt.Fprintf(w, "event: %s\ndata: %s\n\n", name, data)
}
