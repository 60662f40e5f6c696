package inspector_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/calltap/calltap/inspector"
	"github.com/calltap/calltap/inspector/agent"
	"github.com/calltap/calltap/inspector/inspectortest"
	"github.com/calltap/calltap/storage/agentdb"
)

// startInspector runs an agent on the store in dir and the inspector's
// server for it on a socket of its own, as calltap listen does, without a
// relay: what the inspector's checks of who may call it need. Both stop
// with t.Cleanup. It returns the server's URL and the agent.
func startInspector(t *testing.T, dir string) (string, *agent.Agent) {
	t.Helper()
	handler := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.Copy(io.Discard, r.Body) }))
	t.Cleanup(handler.Close)
	ctx, cancel := context.WithCancel(context.Background())
	db, err := agentdb.OpenAgent(ctx, filepath.Join(dir, "agent.db"), agentdb.WithIntake())
	if err != nil {
		t.Fatal(err)
	}
	a, err := agent.New(agent.Config{Store: db, ForwardTo: handler.URL, Logger: slog.New(slog.DiscardHandler), ForwardTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	inspectorURL := "http://" + ln.Addr().String()
	a.SetInspectorURL(inspectorURL)
	hs := &http.Server{Handler: inspector.NewServer(inspector.ServerConfig{Agent: a})}
	var wg sync.WaitGroup
	wg.Go(func() { a.Run(ctx) })
	wg.Go(func() { hs.Serve(ln) })
	t.Cleanup(func() {
		cancel()
		hs.Close()
		wg.Wait()
		db.Close()
	})
	return inspectorURL, a
}

func TestValidInspectHost(t *testing.T) {
	for h, ok := range map[string]bool{
		"inspector.test": true, "fd00::5": true, "[fd00::5]": true,
		"https://inspector.example.com": true, "http://localhost:8080": true,
		"": false, "inspector.test:4040": false, "https://inspector.example.com/ui": false, "ftp://x": false,
	} {
		if err := inspector.ValidInspectHost(h); (err == nil) != ok {
			t.Errorf("ValidInspectHost(%q) = %v, want ok %v", h, err, ok)
		}
	}
}

func TestInspectorRefusesForeignHostAndOrigin(t *testing.T) {
	inspectorURL, _ := startInspector(t, t.TempDir())
	api := inspectorURL + "/api/v1/ext/webhooks/"
	if code, env := inspectortest.Do(t, "GET", api, "", "Host", "evil.example"); code != 403 || env.Error.Code != "forbidden" {
		t.Errorf("foreign Host: %d", code)
	}
	req, _ := http.NewRequest("GET", api, nil)
	req.Host = "evil.example:4040"
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("rebinding Host: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 403 {
		t.Errorf("rebinding Host: %v", resp.StatusCode)
	}
	if code, _ := inspectortest.Do(t, "POST", api+"replay/", `{"id":"x"}`, "Origin", "https://evil.example"); code != 403 {
		t.Errorf("foreign Origin on POST: %d", code)
	}
	if code, _ := inspectortest.Do(t, "POST", api+"replay/", `{"id":"x"}`, "Origin", inspectorURL); code != 404 {
		t.Errorf("own Origin on POST: %d, want 404 (unknown id)", code)
	}
}

func TestInspectorToken(t *testing.T) {
	_, a := startInspector(t, t.TempDir())
	srv := httptest.NewServer(inspector.NewServer(inspector.ServerConfig{Agent: a, Token: "s3cret"}))
	defer srv.Close()
	api := srv.URL + "/api/v1/ext/webhooks/"
	if code, env := inspectortest.Do(t, "GET", api, ""); code != 401 || env.Error.Code != "unauthorized" {
		t.Errorf("without the token: %d", code)
	}
	if code, _ := inspectortest.Do(t, "GET", api, "", "Authorization", "Bearer wrong"); code != 401 {
		t.Errorf("wrong token: %d", code)
	}
	if code, _ := inspectortest.Do(t, "GET", api, "", "Authorization", "Bearer s3cret"); code != 200 {
		t.Errorf("bearer token: %d", code)
	}
	// Opening the UI once with ?token= sets a cookie for the rest.
	jar := &cookieJar{}
	client := &http.Client{Jar: jar}
	resp, err := client.Get(api + "?token=s3cret")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("?token= then cookie: %d", resp.StatusCode)
	}
}

// cookieJar is a minimal jar for one host.
type cookieJar struct {
	mu      sync.Mutex
	cookies []*http.Cookie
}

func (j *cookieJar) SetCookies(_ *url.URL, cs []*http.Cookie) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.cookies = append(j.cookies, cs...)
}

func (j *cookieJar) Cookies(*url.URL) []*http.Cookie {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.cookies
}

// The inspector's Origin check accepts its own origin only: scheme, host
// and port, not just a loopback name.
func TestInspectorOriginMustBeItsOwn(t *testing.T) {
	_, a := startInspector(t, t.TempDir())
	srv := httptest.NewServer(inspector.NewServer(inspector.ServerConfig{Agent: a,
		AllowedHosts: []string{"inspector.test", "https://inspector.example.com"}}))
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	port := u.Port()
	otherPort := fmt.Sprint(mustAtoi(t, port) + 1)
	cases := []struct {
		origin, host string
		allowed      bool
	}{
		{"http://127.0.0.1:" + port, "", true},
		{"http://localhost:" + port, "", true},
		{"http://[::1]:" + port, "", true},
		{"http://inspector.test:" + port, "inspector.test:" + port, true},
		{"https://inspector.example.com", "inspector.example.com", true}, // behind a TLS proxy, as configured
		{"http://localhost:" + otherPort, "", false},                     // another local page
		{"http://127.0.0.1:" + otherPort, "", false},
		{"http://127.0.0.1", "", false},          // port 80
		{"https://127.0.0.1:" + port, "", false}, // it serves plain http
		{"https://inspector.test:" + port, "", false},
		{"http://inspector.example.com", "", false}, // only as configured: https
		{"http://evil.example:" + port, "", false},
		{"null", "", false},
	}
	for _, c := range cases {
		hdr := []string{"Origin", c.origin}
		if c.host != "" {
			hdr = append(hdr, "Host", c.host)
		}
		// A state-changing endpoint: an unknown id is 404 once past the check.
		code, env := inspectortest.Do(t, "POST", srv.URL+"/api/v1/ext/webhooks/replay/", `{"id":"x"}`, hdr...)
		switch {
		case c.allowed && code != http.StatusNotFound:
			t.Errorf("replay with Origin %s: %d %+v, want 404 (allowed, unknown id)", c.origin, code, env.Error)
		case !c.allowed && (code != http.StatusForbidden || env.Error == nil || env.Error.Code != "forbidden"):
			t.Errorf("replay with Origin %s: %d %+v, want 403 forbidden", c.origin, code, env.Error)
		}
		// The live stream.
		if got := streamStatus(t, srv.URL+"/api/v1/ext/stream", hdr...); c.allowed != (got == http.StatusOK) || (!c.allowed && got != http.StatusForbidden) {
			t.Errorf("stream with Origin %s: %d, allowed %v", c.origin, got, c.allowed)
		}
	}
}

// streamStatus opens the event stream and returns its status, then closes it.
func streamStatus(t *testing.T, url string, hdr ...string) int {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, err := http.DefaultClient.Do(inspectortest.Request(t, "GET", url, "", hdr...).WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
