package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/calltap/calltap/relay/wire"
	"github.com/chromedp/chromedp"
)

// harChromium is where the browser tests find Debian's chromium (see
// web/browser_test.go).
func harChromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("CALLTAP_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("chromium is needed to check HAR exports and was not found: apt-get install -y --no-install-recommends chromium (or set CALLTAP_CHROMIUM to its path)")
	return ""
}

// importHAR is what Chromium's Network panel does with "Import HAR file":
// its DevTools front end (served by the browser itself at devtools://)
// checks the document's required fields (HARFormat.HARRoot throws on a
// missing or mistyped one) and turns each entry into a network request.
// It returns what the panel would show of each.
const importHAR = `(async (text) => {
	const HAR = await import('./models/har/har.js');
	const root = new HAR.HARFormat.HARRoot(JSON.parse(text));
	const out = [];
	for (const r of HAR.Importer.Importer.requestsFromHARLog(root.log)) {
		const c = await r.requestContentData();
		out.push({
			url: r.url(), method: r.requestMethod, status: r.statusCode, start: r.startTime,
			headers: r.requestHeaders().map(h => [h.name, h.value]),
			query: (r.queryParameters || []).map(p => [p.name, p.value]),
			post: (await r.requestFormData()) ?? null,
			response: c.error ? null : c.isTextContent ? c.text : c.base64,
		});
	}
	return out;
})`

type devtoolsRequest struct {
	URL      string
	Method   string
	Status   int
	Start    float64
	Headers  [][2]string
	Query    [][2]string
	Post     *string
	Response *string
}

// A HAR export is imported by Chromium's own HAR reader, each entry as it
// was captured: method, URL, headers in order with repeats, query, body
// (base64 when it is not UTF-8), status and answer.
func TestExportHARImportedByChromium(t *testing.T) {
	src, cs := exportStore(t)
	file := filepath.Join(t.TempDir(), "calls.har")
	if code, _, stderr := runCmd(t, "export", "--data", src, "--format", "har", "-o", file); code != 0 {
		t.Fatalf("export: %d %s", code, stderr)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	lit, err := json.Marshal(string(b))
	if err != nil {
		t.Fatal(err)
	}

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(harChromium(t)),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.UserDataDir(t.TempDir()),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	ctx, cancel := context.WithTimeout(bctx, 60*time.Second)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Navigate("devtools://devtools/bundled/devtools_app.html")); err != nil {
		t.Fatalf("opening Chromium's DevTools front end: %v", err)
	}
	got, err := chromedp.Run(ctx, chromedp.Evaluate[[]devtoolsRequest](importHAR+"("+string(lit)+")", chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatalf("Chromium refused the HAR export: %v", err)
	}
	if len(got) != len(cs) {
		t.Fatalf("Chromium read %d requests, want %d", len(got), len(cs))
	}
	for i, r := range got {
		want := cs[i]
		var h wire.Header
		if err := h.UnmarshalJSON([]byte(want.RequestHeaders)); err != nil {
			t.Fatal(err)
		}
		wantHeaders := [][2]string{}
		for _, f := range h {
			wantHeaders = append(wantHeaders, [2]string{f.Name, f.Value})
		}
		wantPost := string(want.Body)
		if !utf8.Valid(want.Body) {
			wantPost = base64.StdEncoding.EncodeToString(want.Body)
		}
		if r.Method != want.Method || !slices.Equal(r.Headers, wantHeaders) || r.Post == nil || *r.Post != wantPost ||
			int64(r.Start) != want.CreatedAt.Unix() {
			t.Errorf("request %d: %s %s at %v, headers %q, body %v; want %s at %d, headers %q, body %q",
				i, r.Method, r.URL, r.Start, r.Headers, r.Post, want.Method, want.CreatedAt.Unix(), wantHeaders, wantPost)
		}
	}
	first := got[0]
	if first.URL != cs[0].Target || !slices.Equal(first.Query, [][2]string{{"a", "1"}, {"a", "2"}}) {
		t.Errorf("first request %s, query %q", first.URL, first.Query)
	}
	// The answer "ok\x00\xff" is base64 in the HAR; Chromium decodes it and,
	// being text/plain, shows it as UTF-8 (the last byte replaced).
	if first.Status != 201 || first.Response == nil || *first.Response != "ok\x00\uFFFD" {
		t.Errorf("first answer %d %v", first.Status, first.Response)
	}
}
