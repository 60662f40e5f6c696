// Package web is the inspector's browser UI: plain HTML, CSS and JavaScript
// modules embedded in the binary, so neither `go build` nor the user needs
// Node. Handler serves them with a strict Content-Security-Policy; the UI
// itself talks only to the inspector's JSON API under /api/.
package web

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strconv"
	"strings"
	"sync"

	"github.com/calltap/calltap/relay/api"
)

//go:embed static
var staticFS embed.FS

// contentSecurityPolicy allows scripts, styles and connections to this origin
// only. No 'unsafe-inline' and no 'unsafe-eval': captured payloads are
// attacker-controlled, so even a rendering bug must not be able to run code.
// Styles set through the CSSOM (el.style.x = …) are not inline styles and
// stay allowed.
const contentSecurityPolicy = "default-src 'none'; " +
	"script-src 'self'; " +
	"style-src 'self'; " +
	"img-src 'self' data:; " +
	"media-src 'self'; " +
	"connect-src 'self'; " +
	"font-src 'self'; " +
	"manifest-src 'self'; " +
	"base-uri 'none'; " +
	"form-action 'none'; " +
	"frame-ancestors 'none'"

// asset is one embedded file, prepared once.
type asset struct {
	body        []byte
	contentType string
	etag        string // quoted strong validator from the content hash
}

// handler serves the embedded assets. Its maps are built once and only read
// afterwards, so it needs no lock.
type handler struct {
	assets map[string]*asset // by URL path, "/static/app.js"
	index  *asset
}

// Handler returns the UI handler. Mount it at "/" after the API routes: it
// serves /static/* from the embedded files, the reference's topics at
// /help/ (helppage.go), answers client routes such as /calls/<id> and
// /requests/<id> with index.html, and answers anything under /api/ that
// reached it with a JSON 404, never with the page.
func Handler() http.Handler { return loadHandler() }

var loadHandler = sync.OnceValue(func() *handler {
	h := &handler{assets: make(map[string]*asset)}
	err := fs.WalkDir(staticFS, "static", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		body, err := staticFS.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(body)
		h.assets["/"+p] = &asset{
			body:        body,
			contentType: contentType(p),
			etag:        `"` + hex.EncodeToString(sum[:12]) + `"`,
		}
		return nil
	})
	if err != nil {
		// The files are compiled in; failing to read them is a build defect.
		panic("web: reading embedded assets: " + err.Error())
	}
	h.index = h.assets["/static/index.html"]
	if h.index == nil {
		panic("web: static/index.html is not embedded")
	}
	return h
})

// contentType is fixed per extension rather than taken from the system's
// mime tables, which differ between machines and sometimes map .js to
// application/x-javascript or nothing at all — and browsers refuse module
// scripts without a JavaScript type.
func contentType(name string) string {
	switch path.Ext(name) {
	case ".html":
		return "text/html; charset=utf-8"
	case ".css":
		return "text/css; charset=utf-8"
	case ".js", ".mjs":
		return "text/javascript; charset=utf-8"
	case ".svg":
		return "image/svg+xml"
	case ".json":
		return "application/json"
	case ".png":
		return "image/png"
	case ".ico":
		return "image/x-icon"
	case ".txt":
		return "text/plain; charset=utf-8"
	}
	if t := mime.TypeByExtension(path.Ext(name)); t != "" {
		return t
	}
	return "application/octet-stream"
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", contentSecurityPolicy)
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("Cross-Origin-Opener-Policy", "same-origin")
	hd.Set("Cross-Origin-Resource-Policy", "same-origin")

	p := r.URL.Path
	if p == "/api" || strings.HasPrefix(p, "/api/") {
		api.WriteError(w, api.NotFound("endpoint "+p))
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		hd.Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	if p == "/help" || strings.HasPrefix(p, "/help/") {
		serveHelp(w, r, strings.Trim(strings.TrimPrefix(p, "/help"), "/"))
		return
	}
	a, ok := h.assets[p]
	if !ok {
		// Files are looked up exactly; anything that looks like a file
		// (has an extension) or lives under /static/ and is missing is a
		// 404, so a broken asset link is visible instead of silently
		// answered with the page. Everything else is a client route.
		if strings.HasPrefix(p, "/static/") || path.Ext(p) != "" {
			http.Error(w, "not found", http.StatusNotFound)
			return
		}
		a = h.index
	}
	serve(w, r, a)
}

func serve(w http.ResponseWriter, r *http.Request, a *asset) {
	hd := w.Header()
	// The file names carry no hash, so the browser must revalidate; the
	// ETag makes that a bodiless 304 over loopback.
	hd.Set("Cache-Control", "no-cache")
	hd.Set("ETag", a.etag)
	if etagMatch(r.Header.Get("If-None-Match"), a.etag) {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	hd.Set("Content-Type", a.contentType)
	hd.Set("Content-Length", strconv.Itoa(len(a.body)))
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		w.Write(a.body)
	}
}

// etagMatch reports whether an If-None-Match header names etag (weak
// comparison, as RFC 9110 asks for If-None-Match).
func etagMatch(header, etag string) bool {
	for _, t := range strings.Split(header, ",") {
		t = strings.TrimSpace(t)
		if t == "*" || strings.TrimPrefix(t, "W/") == etag {
			return true
		}
	}
	return false
}
