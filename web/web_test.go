package web_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/calltap/calltap/web"
)

func get(t *testing.T, h http.Handler, method, path string, hdr ...string) *http.Response {
	t.Helper()
	req := httptest.NewRequest(method, path, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Result()
}

func body(t *testing.T, r *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(r.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestAssetsContentTypes(t *testing.T) {
	h := web.Handler()
	for path, want := range map[string]string{
		"/":                   "text/html; charset=utf-8",
		"/static/index.html":  "text/html; charset=utf-8",
		"/static/app.js":      "text/javascript; charset=utf-8",
		"/static/json.js":     "text/javascript; charset=utf-8",
		"/static/app.css":     "text/css; charset=utf-8",
		"/static/favicon.svg": "image/svg+xml",
	} {
		r := get(t, h, "GET", path)
		if r.StatusCode != 200 {
			t.Errorf("%s: status %d", path, r.StatusCode)
			continue
		}
		if got := r.Header.Get("Content-Type"); got != want {
			t.Errorf("%s: Content-Type %q, want %q", path, got, want)
		}
		if body(t, r) == "" {
			t.Errorf("%s: empty body", path)
		}
	}
}

func TestSecurityHeaders(t *testing.T) {
	h := web.Handler()
	for _, path := range []string{"/", "/static/app.js", "/calls/x", "/static/nope.js"} {
		r := get(t, h, "GET", path)
		csp := r.Header.Get("Content-Security-Policy")
		for _, want := range []string{"script-src 'self'", "default-src 'none'", "frame-ancestors 'none'"} {
			if !strings.Contains(csp, want) {
				t.Errorf("%s: CSP %q lacks %q", path, csp, want)
			}
		}
		if strings.Contains(csp, "unsafe-inline") || strings.Contains(csp, "unsafe-eval") {
			t.Errorf("%s: CSP allows unsafe code: %q", path, csp)
		}
		if got := r.Header.Get("X-Content-Type-Options"); got != "nosniff" {
			t.Errorf("%s: X-Content-Type-Options %q", path, got)
		}
		if got := r.Header.Get("Referrer-Policy"); got != "no-referrer" {
			t.Errorf("%s: Referrer-Policy %q", path, got)
		}
	}
}

// The page itself must hold nothing the CSP would block: no inline script
// or style, no inline event handler, no off-site resource.
func TestIndexHasNoInlineCode(t *testing.T) {
	html := body(t, get(t, web.Handler(), "GET", "/"))
	for _, tag := range regexp.MustCompile(`<script[^>]*>`).FindAllString(html, -1) {
		if !strings.Contains(tag, " src=") {
			t.Errorf("inline script: %s", tag)
		}
	}
	for _, bad := range []string{"<style", " style=", " onload=", " onclick=", " onerror=", "http://", "https://", "javascript:"} {
		if strings.Contains(strings.ToLower(html), bad) {
			t.Errorf("index.html contains %q", bad)
		}
	}
	if !strings.Contains(html, `<script type="module" src="/static/app.js">`) {
		t.Errorf("index.html does not load /static/app.js as a module")
	}
}

func TestClientRoutesFallBackToIndex(t *testing.T) {
	h := web.Handler()
	index := body(t, get(t, h, "GET", "/"))
	for _, path := range []string{"/calls", "/calls/0b6f3b1e-6a43-4a53-9c57-2f3bd1a8c001", "/requests/abc", "/?event=call.ended"} {
		r := get(t, h, "GET", path)
		if r.StatusCode != 200 || body(t, r) != index {
			t.Errorf("%s: status %d, want index.html", path, r.StatusCode)
		}
	}
}

func TestNotFound(t *testing.T) {
	h := web.Handler()
	for _, path := range []string{"/static/missing.js", "/favicon.ico", "/static/"} {
		if r := get(t, h, "GET", path); r.StatusCode != 404 {
			t.Errorf("%s: status %d, want 404", path, r.StatusCode)
		}
	}
}

// A request under /api/ that reached the UI handler is an unknown endpoint:
// it gets the API's JSON envelope, never the page.
func TestAPIPathsAreNeverThePage(t *testing.T) {
	h := web.Handler()
	for _, path := range []string{"/api", "/api/", "/api/v1/ext/nope", "/api/v1/ext/webhooks/x/y/z"} {
		r := get(t, h, "GET", path)
		if r.StatusCode != 404 {
			t.Errorf("%s: status %d, want 404", path, r.StatusCode)
		}
		if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
			t.Errorf("%s: Content-Type %q", path, ct)
		}
		var env struct {
			Status bool `json:"status"`
			Error  struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(body(t, r)), &env); err != nil || env.Status || env.Error.Code != "not_found" {
			t.Errorf("%s: body is not a not_found envelope (err %v, %+v)", path, err, env)
		}
	}
}

func TestETagRevalidation(t *testing.T) {
	h := web.Handler()
	r := get(t, h, "GET", "/static/app.js")
	etag := r.Header.Get("ETag")
	if !regexp.MustCompile(`^"[0-9a-f]{24}"$`).MatchString(etag) {
		t.Fatalf("ETag %q", etag)
	}
	if cc := r.Header.Get("Cache-Control"); cc != "no-cache" {
		t.Errorf("Cache-Control %q", cc)
	}
	r2 := get(t, h, "GET", "/static/app.js", "If-None-Match", etag)
	if r2.StatusCode != http.StatusNotModified || body(t, r2) != "" {
		t.Errorf("If-None-Match: status %d, want 304 without body", r2.StatusCode)
	}
	r3 := get(t, h, "GET", "/static/app.js", "If-None-Match", `"other", W/`+etag)
	if r3.StatusCode != http.StatusNotModified {
		t.Errorf("weak match in a list: status %d, want 304", r3.StatusCode)
	}
	if other := get(t, h, "GET", "/static/app.css").Header.Get("ETag"); other == etag {
		t.Errorf("two files share ETag %s", etag)
	}
}

func TestMethods(t *testing.T) {
	h := web.Handler()
	r := get(t, h, "HEAD", "/static/app.css")
	if r.StatusCode != 200 || body(t, r) != "" || r.Header.Get("Content-Length") == "" {
		t.Errorf("HEAD: status %d, Content-Length %q", r.StatusCode, r.Header.Get("Content-Length"))
	}
	for _, m := range []string{"POST", "PUT", "DELETE"} {
		r := get(t, h, m, "/")
		if r.StatusCode != http.StatusMethodNotAllowed || r.Header.Get("Allow") != "GET, HEAD" {
			t.Errorf("%s /: status %d, Allow %q", m, r.StatusCode, r.Header.Get("Allow"))
		}
	}
}

// Every module the page imports must be embedded and served, so a typo in
// an import is a test failure rather than a blank page.
func TestModuleImportsResolve(t *testing.T) {
	h := web.Handler()
	seen := map[string]bool{}
	queue := []string{"/static/app.js"}
	imp := regexp.MustCompile(`(?m)^\s*import\s[^'"]*['"](\./[\w.-]+\.js)['"]`)
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if seen[p] {
			continue
		}
		seen[p] = true
		r := get(t, h, "GET", p)
		if r.StatusCode != 200 {
			t.Errorf("%s: status %d", p, r.StatusCode)
			continue
		}
		src := body(t, r)
		for _, m := range imp.FindAllStringSubmatch(src, -1) {
			queue = append(queue, "/static/"+strings.TrimPrefix(m[1], "./"))
		}
		// No code that builds HTML from strings: payloads are rendered as
		// text only.
		for _, bad := range []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"} {
			if strings.Contains(src, bad) {
				t.Errorf("%s uses %s", p, bad)
			}
		}
	}
	if len(seen) < 5 {
		t.Errorf("only %d modules reachable from app.js", len(seen))
	}
}
