package web_test

// Browser tests: Debian's chromium, headless, driven through chromedp
// against a whole calltap stack on loopback (relay, agent, inspector with
// the embedded UI). Nothing is mocked; screenshots of each scenario are
// written as test artefacts.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/google/uuid"

	"github.com/calltap/calltap/cmd/stacktest"
	"github.com/calltap/calltap/relay/polltest"
	"github.com/calltap/calltap/storage/agentdb"
	"github.com/calltap/calltap/web"
)

// wait bounds every poll of the page; generous because the machine may be
// busy with -race builds of other packages.
const wait = time.Minute

func chromiumPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("CALLTAP_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if _, err := os.Stat("/usr/bin/chromium"); err == nil {
		return "/usr/bin/chromium"
	}
	t.Fatal("chromium is needed for the browser tests and was not found: install chromium: apt-get install -y --no-install-recommends chromium (or set CALLTAP_CHROMIUM to its path)")
	return ""
}

// startBrowser starts one headless chromium for the test and its subtests.
func startBrowser(t *testing.T) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1400, 900),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	bctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("starting chromium: %v (install chromium: apt-get install -y --no-install-recommends chromium)", err)
	}
	return bctx
}

// page is one browser tab on an inspector.
type tab struct {
	t       *testing.T
	ctx     context.Context
	base    string // the inspector's URL
	dir     string // screenshots
	shots   int
	dialogs atomic.Int32

	mu         sync.Mutex
	exceptions []string // guarded by mu
}

func newTab(t *testing.T, browser context.Context, inspectorURL string) *tab {
	t.Helper()
	ctx, cancel := chromedp.NewContext(browser)
	t.Cleanup(cancel)
	if err := chromedp.Do(ctx); err != nil {
		t.Fatal(err)
	}
	tb := &tab{t: t, ctx: ctx, base: inspectorURL, dir: artifacts(t)}
	// Any dialog is a failure (a payload ran code); dismiss it so the page
	// does not hang, and count it.
	dialogs := chromedp.Events(ctx, page.JavascriptDialogOpening)
	go func() {
		for _, err := range dialogs {
			if err != nil {
				return
			}
			tb.dialogs.Add(1)
			chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: false})
		}
	}()
	exc := chromedp.Events(ctx, runtime.ExceptionThrown)
	go func() {
		for ev, err := range exc {
			if err != nil {
				return
			}
			msg := ev.ExceptionDetails.Text
			if ev.ExceptionDetails.Exception != nil {
				msg += " " + ev.ExceptionDetails.Exception.Description
			}
			tb.mu.Lock()
			tb.exceptions = append(tb.exceptions, msg)
			tb.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		tb.mu.Lock()
		defer tb.mu.Unlock()
		for _, e := range tb.exceptions {
			t.Errorf("uncaught exception in the page: %s", e)
		}
	})
	return tb
}

// artifacts is where screenshots go: $CALLTAP_ARTIFACTS/browser, or a
// temporary directory of the test.
func artifacts(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("CALLTAP_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	} else {
		dir = filepath.Join(dir, "browser")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func (tb *tab) do(actions ...chromedp.Action[chromedp.Void]) {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, wait)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		tb.shot("failed")
		tb.t.Fatalf("browser: %v", err)
	}
}

// click clicks the element sel selects, as a person would. The live views
// re-render as events arrive, and a node replaced between chromedp's
// query and its click fails the click: then it queries again.
func (tb *tab) click(sel string) {
	tb.t.Helper()
	deadline := time.Now().Add(wait)
	for {
		ctx, cancel := context.WithTimeout(tb.ctx, wait)
		err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(sel)))
		cancel()
		if err == nil {
			return
		}
		if !strings.Contains(err.Error(), "Could not find node") || time.Now().After(deadline) {
			tb.shot("failed")
			tb.t.Fatalf("browser: clicking %s: %v", sel, err)
		}
	}
}

func (tb *tab) open(path string) {
	tb.t.Helper()
	tb.do(chromedp.Navigate(tb.base + path))
	// The app is a module: wait until it has built its frame.
	tb.waitFor("the app to start", `!!document.querySelector('.topbar .status .state')`)
}

func evalJS[T any](tb *tab, expr string) (T, error) {
	ctx, cancel := context.WithTimeout(tb.ctx, wait)
	defer cancel()
	return chromedp.Run(ctx, chromedp.Evaluate[T](expr))
}

func (tb *tab) str(expr string) string {
	tb.t.Helper()
	v, err := evalJS[string](tb, expr)
	if err != nil {
		tb.t.Fatalf("evaluating %s: %v", expr, err)
	}
	return v
}

func (tb *tab) js(expr string) {
	tb.t.Helper()
	if _, err := evalJS[chromedp.Void](tb, "(() => { "+expr+"; })()"); err != nil {
		tb.t.Fatalf("evaluating %s: %v", expr, err)
	}
}

// waitFor polls a JavaScript condition until it holds or the deadline
// passes.
func (tb *tab) waitFor(what, cond string) {
	tb.t.Helper()
	deadline := time.Now().Add(wait)
	var lastErr error
	for {
		ok, err := evalJS[bool](tb, "!!("+cond+")")
		if err == nil && ok {
			return
		}
		lastErr = err
		if time.Now().After(deadline) {
			tb.shot("timeout")
			tb.t.Fatalf("waited %s for %s: %s never held (last error: %v)", wait, what, cond, lastErr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// shot saves a screenshot as a test artefact.
func (tb *tab) shot(name string) {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, wait)
	defer cancel()
	buf, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		tb.t.Logf("screenshot %s: %v", name, err)
		return
	}
	tb.shots++
	safe := regexp.MustCompile(`[^A-Za-z0-9_.-]+`).ReplaceAllString(tb.t.Name(), "_")
	p := filepath.Join(tb.dir, fmt.Sprintf("%s-%02d-%s.png", safe, tb.shots, name))
	if err := os.WriteFile(p, buf, 0o644); err != nil {
		tb.t.Logf("screenshot %s: %v", name, err)
		return
	}
	tb.t.Logf("screenshot: %s", p)
}

// handler is the developer's local handler: it records what reached it.
type handler struct {
	srv  *httptest.Server
	fail atomic.Int32 // answer 503 to this many more requests
	mu   sync.Mutex
	got  []received // guarded by mu
}

type received struct {
	Method, Path string
	Header       http.Header
	Body         []byte
}

func newHandler(t *testing.T) *handler {
	h := &handler{}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		h.mu.Lock()
		h.got = append(h.got, received{r.Method, r.URL.RequestURI(), r.Header.Clone(), b})
		h.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Handler", "test")
		if h.fail.Add(-1) >= 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `{"ok":false}`)
			return
		}
		io.WriteString(w, `{"ok":true}`)
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *handler) received() []received {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]received(nil), h.got...)
}

type stack struct {
	*stacktest.Stack
	h *handler
}

func startStack(t *testing.T) *stack {
	t.Helper()
	h := newHandler(t)
	s := stacktest.Start(t, stacktest.Options{ForwardTo: h.srv.URL + "/hook", Assets: web.Handler()})
	return &stack{Stack: s, h: h}
}

// send posts body to the tunnel's public URL and returns the status.
func (s *stack) send(t *testing.T, path string, body []byte, header ...string) int {
	t.Helper()
	req, err := http.NewRequest("POST", s.TunnelURL+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode
}

// sendStarted sends the call.started of a new call and returns the id of
// its capture.
func (s *stack) sendStarted(t *testing.T) string {
	t.Helper()
	if code := s.send(t, "/hook", event("call.started", uuid.NewString(), time.Now(), nil)); code != 200 {
		t.Fatalf("sender got %d", code)
	}
	return s.captures(t)[0].ID
}

type summary struct {
	ID          string `json:"id"`
	Path        string `json:"path"`
	Event       string `json:"event"`
	ReplayOf    string `json:"replay_of"`
	CallID      string `json:"call_id"`
	DeliveryID  string `json:"delivery_id"`
	DuplicateOf string `json:"duplicate_of"`
}

// captures lists the newest captures through the inspector's API.
func (s *stack) captures(t *testing.T) []summary {
	t.Helper()
	res, err := http.Get(s.InspectorURL + "/api/v1/ext/webhooks/?limit=200")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var env struct {
		Data struct {
			Results []summary `json:"results"`
		} `json:"data"`
	}
	if err := json.NewDecoder(res.Body).Decode(&env); err != nil {
		t.Fatal(err)
	}
	return env.Data.Results
}

// event builds a call event as the service documents it (section 6.4).
func event(kind, callID string, at time.Time, extra map[string]any) []byte {
	p := map[string]any{
		"id":          uuid.NewString(),
		"event":       kind,
		"occurred_at": at.UTC().Format(time.RFC3339Nano),
		"call": map[string]any{
			"call_id": callID, "direction": "outbound", "status": "completed",
			"outcome": nil, "outcome_code": nil, "disposition": "interested",
			"from_number": "+14155550100", "to_number": "+33612345678",
			"started_at":       at.Add(-3 * time.Minute).UTC().Format(time.RFC3339),
			"answered_at":      at.Add(-170 * time.Second).UTC().Format(time.RFC3339),
			"ended_at":         at.Add(10 * time.Second).UTC().Format(time.RFC3339),
			"duration_seconds": 180, "attempt_number": 1, "campaign_id": "5b0b7c1e-1111-4c1a-9a3e-0d5c0f6f0001",
			"agent":     map[string]any{"id": uuid.NewString(), "name": "Ava"},
			"contact":   map[string]any{"id": uuid.NewString(), "name": "Dana Whitaker", "phone": "+33612345678", "email": "dana@example.com", "custom_fields": map[string]any{"city": "Lyon"}},
			"variables": map[string]any{"lead_id": "EZ-1042"},
		},
		"data": map[string]any{"event": "room_finished", "room": map[string]any{"sid": "RM_1"}},
	}
	for k, v := range extra {
		p[k] = v
	}
	// Senders do not escape <, > and & in JSON strings; neither do we, so
	// hostile markup reaches the agent as markup.
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.Encode(p)
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

const visibleRows = `[...document.querySelectorAll('[data-view=requests] .vrow:not([hidden]):not(.skeleton)')]`

func rowFor(id string) string {
	return fmt.Sprintf(`document.querySelector('[data-view=requests] .vrow[data-key=%q]')`, id)
}

func TestBrowser(t *testing.T) {
	browser := startBrowser(t)

	t.Run("LiveListAndDetail", func(t *testing.T) {
		s := startStack(t)
		tb := newTab(t, browser, s.InspectorURL)
		tb.open("/")
		tb.waitFor("the empty state", `document.querySelector('[data-view=requests] .vlist-empty .empty-title')?.textContent === 'Waiting for requests'`)
		tb.waitFor("the tunnel state", `document.querySelector('.topbar .state')?.textContent === 'connected'`)
		if got := tb.str(`document.querySelector('.topbar .tunnel-url .mono').textContent`); got != s.TunnelURL {
			t.Errorf("status bar shows %q, want the tunnel URL %q", got, s.TunnelURL)
		}
		tb.shot("empty")
		tb.js(`window.__sameDocument = 'yes'`)

		callID := uuid.NewString()
		if code := s.send(t, "/webhooks/voice?tenant=acme", event("call.ended", callID, time.Now(), nil), "X-Calltap-Test", "first", "X-Calltap-Test", "second"); code != 200 {
			t.Fatalf("sender got %d", code)
		}
		caps := s.captures(t)
		if len(caps) != 1 {
			t.Fatalf("%d captures, want 1", len(caps))
		}
		id := caps[0].ID
		tb.waitFor("the capture to appear live", rowFor(id)+`?.querySelector('.c-status')?.textContent === '200'`)
		if tb.str(`window.__sameDocument || 'reloaded'`) != "yes" {
			t.Error("the page reloaded to show the capture")
		}
		row := func(sel string) string { return tb.str(rowFor(id) + `.querySelector('` + sel + `').textContent`) }
		if got := row(".c-path"); got != "POST/webhooks/voice?tenant=acme" { // method, path, query
			t.Errorf("row path %q", got)
		}
		if got := row(".c-event"); got != "ended" {
			t.Errorf("row event badge %q, want ended", got)
		}
		if got := row(".c-call"); got != callID[:8] {
			t.Errorf("row call %q, want %q", got, callID[:8])
		}
		if got := row(".c-method"); got != "POST" {
			t.Errorf("row method %q", got)
		}
		tb.shot("live")

		tb.click(fmt.Sprintf(`[data-view=requests] .vrow[data-key=%q] .c-path`, id))
		tb.waitFor("the detail", `location.pathname === '/requests/`+id+`' && !!document.querySelector('.detail-pane .tab-request .htable')`)
		headers := tb.str(`[...document.querySelectorAll('.detail-pane .tab-request .htable tr')].map(r => r.cells[0].textContent + ': ' + r.cells[1].textContent).join('\n')`)
		for _, want := range []string{"X-Calltap-Test: first", "X-Calltap-Test: second", "Content-Type: application/json"} {
			if !strings.Contains(headers, want) {
				t.Errorf("headers table lacks %q:\n%s", want, headers)
			}
		}
		// Pretty JSON: keys, strings and numbers in their colours.
		tb.waitFor("the JSON tree", `!!document.querySelector('.detail-pane .jtree')`)
		if !strings.Contains(tb.str(`[...document.querySelectorAll('.detail-pane .jtree .jk')].map(e => e.textContent).join(' ')`), `"call_id"`) {
			t.Error(`the JSON tree has no "call_id" key`)
		}
		if !strings.Contains(tb.str(`[...document.querySelectorAll('.detail-pane .jtree .js')].map(e => e.textContent).join(' ')`), strconv.Quote(callID)) {
			t.Error("the JSON tree does not show the call id as a string")
		}
		if tb.str(`[...document.querySelectorAll('.detail-pane .jtree .jnum')].map(e => e.textContent).join(' ')`) == "" {
			t.Error("the JSON tree shows no number")
		}
		color := tb.str(`getComputedStyle(document.querySelector('.detail-pane .jtree .jk')).color + '|' + getComputedStyle(document.querySelector('.detail-pane .jtree .js')).color`)
		if parts := strings.Split(color, "|"); parts[0] == parts[1] {
			t.Errorf("keys and strings share a colour (%s): no syntax colours", color)
		}
		tb.shot("detail")

		// Collapse the call block and open it again.
		callNode := `document.querySelector('.detail-pane .jn[data-path="call"]')`
		tb.click(`.detail-pane .jn[data-path="call"] > .jhead`)
		tb.waitFor("the call block to collapse", callNode+`.classList.contains('collapsed')`)
		tb.click(`.detail-pane .jn[data-path="call"] > .jhead`)
		tb.waitFor("the call block to open", `!`+callNode+`.classList.contains('collapsed')`)

		// The response tab shows the handler's answer.
		tb.click(`.detail-pane .tab[data-tab=response]`)
		tb.waitFor("the response", `document.querySelector('.detail-pane .tab-response')?.textContent.includes('X-Handler')`)
		if !strings.Contains(tb.str(`document.querySelector('.detail-pane .tab-response').textContent`), `"ok"`) {
			t.Error("the response tab does not show the handler's body")
		}
		tb.click(`.detail-pane .tab[data-tab=request]`)

		// Keyboard: a second capture, then k/j and Enter move and open.
		s.send(t, "/webhooks/voice", event("call.started", callID, time.Now(), nil))
		tb.waitFor("the second capture", visibleRows+`.length === 2`)
		second := s.captures(t)[0].ID
		tb.js(`document.activeElement.blur()`)
		tb.do(chromedp.KeyEvent("k"), chromedp.KeyEvent("\r"))
		tb.waitFor("k and Enter to open the newest", `location.pathname === '/requests/`+second+`'`)
		tb.do(chromedp.KeyEvent("j"), chromedp.KeyEvent("\r"))
		tb.waitFor("j and Enter to open the older one", `location.pathname === '/requests/`+id+`'`)
		tb.do(chromedp.KeyEvent("/"))
		tb.waitFor("/ to focus search", `document.activeElement === document.querySelector('.filters .f-q')`)
	})

	t.Run("EditAndReplay", func(t *testing.T) {
		s := startStack(t)
		callID := uuid.NewString()
		s.send(t, "/webhooks/voice", event("call.analysis_completed", callID, time.Now(), map[string]any{
			"analysis": map[string]any{"summary": "Wants 40 seats", "sentiment": "positive", "lead_score": 0.82},
		}))
		orig := s.captures(t)[0].ID
		before := len(s.h.received())

		tb := newTab(t, browser, s.InspectorURL)
		tb.open("/requests/" + orig) // a client route, straight from the address bar
		tb.waitFor("the detail", `!!document.querySelector('.detail-pane .act-edit')`)
		tb.click(`.detail-pane .act-edit`)
		tb.waitFor("the dialog", `document.querySelector('dialog.replay-dlg')?.open`)

		setBody := func(v string) {
			tb.js(fmt.Sprintf(`(b => { b.value = %s; b.dispatchEvent(new Event('input')); })(document.querySelector('.r-body'))`, strconv.Quote(v)))
		}
		// Invalid JSON is refused inline, before anything is sent.
		setBody(`{"event": "call.analysis_completed",, }`)
		tb.waitFor("the inline JSON error", `document.querySelector('.r-body-status .bad')?.textContent.includes('line 1')`)
		if tb.str(`String(document.querySelector('.r-send').disabled)`) != "true" {
			t.Error("send is enabled with invalid JSON")
		}
		tb.shot("invalid-json")

		edited := string(event("call.analysis_completed", callID, time.Now(), map[string]any{"edited": "EDITED-42"}))
		setBody(edited)
		tb.waitFor("the JSON to validate", `document.querySelector('.r-body-status .good') && !document.querySelector('.r-send').disabled`)
		tb.js(`(p => { p.value = '/webhooks/edited?x=1'; })(document.querySelector('.r-path'))`)
		tb.shot("edit")
		tb.click(`.r-send`)
		tb.waitFor("the dialog to close", `!document.querySelector('dialog.replay-dlg').open`)

		// The edited request reached the handler.
		polltest.Until(t, wait, func() bool { return len(s.h.received()) > before }, "the replay never reached the handler")
		got := s.h.received()[before]
		if string(got.Body) != edited {
			t.Errorf("handler got body\n%s\nwant the edited body\n%s", got.Body, edited)
		}
		if got.Path != "/hook/webhooks/edited?x=1" {
			t.Errorf("handler got path %q, want the edited one", got.Path)
		}

		// It shows up live, flagged, linking to the original.
		var replayID string
		for _, c := range s.captures(t) {
			if c.ReplayOf == orig {
				replayID = c.ID
			}
		}
		if replayID == "" {
			t.Fatal("no capture with replay_of = the original")
		}
		tb.waitFor("the replay in the list", rowFor(replayID)+`?.querySelector('.f-replay')`)
		tb.waitFor("the toast", `document.querySelector('.toast a')?.getAttribute('href') === '/requests/`+replayID+`'`)
		tb.click(fmt.Sprintf(`[data-view=requests] .vrow[data-key=%q] .c-path`, replayID))
		tb.waitFor("the replay's detail", `document.querySelector('.detail-pane .d-meta .rel a')?.getAttribute('href') === '/requests/`+orig+`'`)
		tb.shot("replayed")

		// One click replays unchanged.
		before = len(s.h.received())
		tb.click(`.detail-pane .act-replay`)
		polltest.Until(t, wait, func() bool { return len(s.h.received()) > before }, "one-click replay never reached the handler")
		if got := s.h.received()[before]; string(got.Body) != edited {
			t.Errorf("one-click replay of the replay sent %s", got.Body)
		}
	})

	t.Run("ReplayWithServiceRetries", func(t *testing.T) {
		s := startStack(t)
		s.send(t, "/webhooks/voice", event("call.ended", uuid.NewString(), time.Now(), nil))
		orig := s.captures(t)[0].ID
		tb := newTab(t, browser, s.InspectorURL)
		tb.open("/requests/" + orig)
		tb.waitFor("the detail", `!!document.querySelector('.detail-pane .act-edit')`)
		tb.click(`.detail-pane .act-edit`)
		tb.waitFor("the dialog", `document.querySelector('dialog.replay-dlg')?.open`)
		s.h.fail.Store(2) // two 503s, then 200: three attempts
		tb.click(`.r-retry`)
		tb.js(`(i => { i.value = '0.001'; })(document.querySelector('.r-scale'))`)
		tb.click(`.r-send`)
		tb.waitFor("the dialog to close", `!document.querySelector('dialog.replay-dlg').open`)
		polltest.Until(t, wait, func() bool { return len(s.h.received()) == 4 }, "the handler did not get three attempts")
		var replayID string
		for _, c := range s.captures(t) {
			if c.ReplayOf == orig {
				replayID = c.ID
			}
		}
		tb.waitFor("the replay to succeed in the list", rowFor(replayID)+`?.querySelector('.c-status')?.textContent === '200'`)
		tb.click(fmt.Sprintf(`[data-view=requests] .vrow[data-key=%q] .c-time`, replayID))
		tb.waitFor("the replay's detail", `!!document.querySelector('.detail-pane .tab[data-tab=history]')`)
		tb.click(`.detail-pane .tab[data-tab=history]`)
		tb.waitFor("three attempts in the history", `document.querySelectorAll('.detail-pane .tab-history table.grid')[0]?.tBodies[0].rows.length === 3`)
		statuses := tb.str(`[...document.querySelectorAll('.detail-pane .tab-history table.grid')[0].tBodies[0].rows].map(r => r.cells[2].textContent).join(' ')`)
		if statuses != "503 503 200" {
			t.Errorf("attempt statuses %q, want 503 503 200", statuses)
		}
		tb.shot("attempts")
	})

	t.Run("FilterSurvivesReload", func(t *testing.T) {
		s := startStack(t)
		callID := uuid.NewString()
		for _, kind := range []string{"call.started", "call.connected", "call.ended", "call.ended"} {
			s.send(t, "/webhooks/voice", event(kind, callID, time.Now(), nil))
		}
		s.send(t, "/health", []byte(`{"ping":true}`))

		tb := newTab(t, browser, s.InspectorURL)
		tb.open("/")
		tb.waitFor("all rows", visibleRows+`.length === 5`)
		tb.js(`(s => { s.value = 'call.ended'; s.dispatchEvent(new Event('change')); })(document.querySelector('.filters .f-event'))`)
		check := func(when string) {
			t.Helper()
			tb.waitFor("the filtered list "+when, visibleRows+`.length === 2 && `+visibleRows+`.every(r => r.querySelector('.c-event').textContent === 'ended')`)
			if got := tb.str(`document.querySelector('[data-view=requests] .lfoot .count').textContent`); got != "2 requests" {
				t.Errorf("%s: count %q", when, got)
			}
			if got := tb.str(`document.querySelector('.filters .f-event').value`); got != "call.ended" {
				t.Errorf("%s: the event filter shows %q", when, got)
			}
		}
		check("after choosing")
		if got := tb.str(`location.search`); got != "?event=call.ended" {
			t.Errorf("URL query %q, want the filter in it", got)
		}
		tb.shot("filtered")
		tb.do(chromedp.Reload())
		tb.waitFor("the app to restart", `!!document.querySelector('.topbar .status .state')`)
		check("after a reload")

		// Search and status filters combine and land in the URL too.
		tb.js(`(s => { s.value = 'none'; s.dispatchEvent(new Event('change')); })(document.querySelector('.filters .f-status_class'))`)
		tb.waitFor("no rows for status none", `document.querySelector('[data-view=requests] .vlist-empty .empty-title')?.textContent.includes('No requests match')`)
		if got := tb.str(`location.search`); got != "?event=call.ended&status_class=none" {
			t.Errorf("URL query %q", got)
		}
		tb.click(`.filters .f-clear`)
		tb.waitFor("the whole list back", visibleRows+`.length === 5 && location.search === ''`)
		tb.do(chromedp.Click(chromedp.CSS(`.filters .f-q`)), chromedp.SendKeys(chromedp.CSS(`.filters .f-q`), "ping\r"))
		tb.waitFor("the full-text search", visibleRows+`.length === 1 && location.search === '?q=ping'`)
		tb.shot("search")
	})

	t.Run("BinaryBodyAsHex", func(t *testing.T) {
		s := startStack(t)
		bin := make([]byte, 300)
		for i := range bin {
			bin[i] = byte(i)
		}
		req, _ := http.NewRequest("PUT", s.TunnelURL+"/upload", bytes.NewReader(bin))
		req.Header.Set("Content-Type", "application/octet-stream")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		id := s.captures(t)[0].ID
		tb := newTab(t, browser, s.InspectorURL)
		tb.open("/requests/" + id)
		tb.waitFor("the hex view", `document.querySelector('.detail-pane pre.hex')?.textContent.startsWith('00000000  00 01 02 03 04 05 06 07  08 09 0a 0b 0c 0d 0e 0f  ................')`)
		if got := tb.str(`document.querySelector('.detail-pane .d-method').textContent`); got != "PUT" {
			t.Errorf("method %q", got)
		}
		if got := tb.str(`document.querySelector('.detail-pane .act-download').getAttribute('href')`); got != "/api/v1/ext/webhooks/"+id+"/body" {
			t.Errorf("download link %q", got)
		}
		tb.shot("hex")
	})

	t.Run("CallEventsInOrder", func(t *testing.T) {
		s := startStack(t)
		callID := uuid.NewString()
		t0 := time.Now().Add(-10 * time.Minute).UTC()
		started := event("call.started", callID, t0, nil)
		connected := event("call.connected", callID, t0.Add(5*time.Second), nil)
		ended := event("call.ended", callID, t0.Add(65*time.Second), nil)
		analysis := event("call.analysis_completed", callID, t0.Add(3*time.Minute), map[string]any{
			"analysis": map[string]any{"summary": "Dana wants 40 seats.", "short_summary": "40 seats", "sentiment": "positive", "lead_score": 0.82, "disposition": "interested",
				"extracted_responses": []any{map[string]any{"question": "How many seats?", "variableName": "seats", "answer": "40", "weight": 0.5}}},
			"media": map[string]any{"recording_url": "javascript:alert(1)", "transcript_url": "https://media.invalid/t.txt", "expires_in": 3600},
		})
		// Delivered out of order: connected arrives after ended.
		for _, b := range [][]byte{started, ended, connected, analysis} {
			s.send(t, "/webhooks/voice", b)
		}

		tb := newTab(t, browser, s.InspectorURL)
		tb.open("/")
		tb.click(`.topbar .navlink[data-view=calls]`)
		callRow := fmt.Sprintf(`[data-view=calls] .vrow[data-key=%q]`, callID)
		tb.waitFor("the call in the calls list", `location.pathname === '/calls' && document.querySelector('`+callRow+` .c-n')?.textContent === '4'`)
		tb.click(callRow + ` .c-time`)
		tb.waitFor("the call's timeline", `location.pathname === '/calls/`+callID+`' && document.querySelectorAll('[data-view=calls] .tl-lane:not(.tl-head)').length === 4`)
		lanes := tb.str(`[...document.querySelectorAll('[data-view=calls] .tl-lane:not(.tl-head)')].map(l => l.dataset.event).join(' ')`)
		if want := "call.started call.connected call.ended call.analysis_completed"; lanes != want {
			t.Errorf("timeline lanes %q, want the order they occurred: %q", lanes, want)
		}
		rows := tb.str(`[...document.querySelectorAll('[data-view=calls] tr.ev-row')].map(r => r.dataset.event).join(' ')`)
		if want := "call.started call.connected call.ended call.analysis_completed"; rows != want {
			t.Errorf("events table %q, want %q", rows, want)
		}
		// Drawn to scale: ended is further right than connected, by about
		// the 60 s between them out of the whole span.
		pos := tb.str(`[...document.querySelectorAll('[data-view=calls] .tl-lane:not(.tl-head) .tl-occ')].map(e => e.style.left).join(' ')`)
		var left []float64
		for _, p := range strings.Fields(pos) {
			f, _ := strconv.ParseFloat(strings.TrimSuffix(p, "%"), 64)
			left = append(left, f)
		}
		if len(left) != 4 || !(left[0] < left[1] && left[1] < left[2] && left[2] < left[3]) {
			t.Errorf("occurred marks at %v, want increasing", left)
		}
		body := tb.str(`document.querySelector('[data-view=calls] .detail-pane').textContent`)
		for _, want := range []string{"Dana wants 40 seats.", "How many seats?", "Dana Whitaker", "EZ-1042", "out_of_order"} {
			if !strings.Contains(body, want) {
				t.Errorf("the call detail does not show %q", want)
			}
		}
		// A javascript: media link is text, never a link.
		if n := tb.str(`String(document.querySelectorAll('[data-view=calls] a[href^="javascript"]').length)`); n != "0" {
			t.Errorf("%s javascript: links", n)
		}
		tb.shot("call")

		// A new event of the open call shows up without a reload.
		s.send(t, "/webhooks/voice", event("call.recording_available", callID, t0.Add(80*time.Second), nil))
		tb.waitFor("the new event in the timeline", `document.querySelectorAll('[data-view=calls] .tl-lane:not(.tl-head)').length === 5`)
		lanes = tb.str(`[...document.querySelectorAll('[data-view=calls] .tl-lane:not(.tl-head)')].map(l => l.dataset.event).join(' ')`)
		if want := "call.started call.connected call.ended call.recording_available call.analysis_completed"; lanes != want {
			t.Errorf("timeline lanes %q, want %q", lanes, want)
		}
	})

	t.Run("ReplayCallAndExport", func(t *testing.T) {
		s := startStack(t)
		callID := uuid.NewString()
		t0 := time.Now().Add(-time.Minute).UTC()
		for _, b := range [][]byte{event("call.started", callID, t0, nil), event("call.ended", callID, t0.Add(30*time.Second), nil)} {
			s.send(t, "/webhooks/voice", b)
		}
		tb := newTab(t, browser, s.InspectorURL)
		tb.open("/calls/" + callID)
		tb.waitFor("the call's timeline", `document.querySelectorAll('[data-view=calls] .tl-lane:not(.tl-head)').length === 2`)
		// Back to back, from the button: both events reach the handler again.
		tb.js(`document.querySelector('[data-view=calls] .act-replay-spacing').value = '0'`)
		tb.click(`[data-view=calls] .act-replay-call`)
		polltest.Until(t, 10*time.Second, func() bool { return len(s.h.received()) == 4 }, "the call was not replayed from the button")
		// And from the keyboard.
		tb.do(chromedp.KeyEvent("r"))
		polltest.Until(t, 10*time.Second, func() bool { return len(s.h.received()) == 6 }, "the call was not replayed with r")
		got := s.h.received()
		for i, want := range []string{"call.started", "call.ended", "call.started", "call.ended", "call.started", "call.ended"} {
			if !strings.Contains(string(got[i].Body), want) {
				t.Errorf("delivery %d is not %s", i, want)
			}
		}

		// Export follows the filters, from its link and from the keyboard.
		tb.open("/?event=call.ended")
		tb.waitFor("the filtered list", `!!document.querySelector('[data-view=requests] .act-export-jsonl')`)
		tb.do(chromedp.KeyEvent("x"))
		href := tb.str(`document.querySelector('[data-view=requests] .act-export-jsonl').href`)
		if !strings.Contains(href, "/api/v1/ext/export?") || !strings.Contains(href, "event=call.ended") || !strings.Contains(href, "format=jsonl") {
			t.Fatalf("export link %q", href)
		}
		resp, err := http.Get(href)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if resp.StatusCode != 200 || len(lines) < 2 || !strings.Contains(lines[0], "calltap-export") || strings.Contains(string(b), "call.started") {
			t.Errorf("the export behind the link: %d\n%s", resp.StatusCode, b)
		}
		tb.js(`document.querySelector('[data-view=requests] .act-export-har').dispatchEvent(new MouseEvent('mousedown'))`)
		if har := tb.str(`document.querySelector('[data-view=requests] .act-export-har').href`); !strings.Contains(har, "format=har") {
			t.Errorf("HAR link %q", har)
		}
	})

	t.Run("ContractChecksAsAnnotations", func(t *testing.T) {
		s := startStack(t)
		b := event("call.started", uuid.NewString(), time.Now(), nil)
		b = bytes.Replace(b, []byte(`"to_number":"+33612345678"`), []byte(`"to_number":"0612345678"`), 1)
		s.send(t, "/webhooks/voice", b)
		id := s.captures(t)[0].ID
		tb := newTab(t, browser, s.InspectorURL)
		tb.open("/requests/" + id)
		tb.waitFor("the annotation on call.to_number", `document.querySelector('.detail-pane .jl.annotated[data-path="call.to_number"] .annot')`)
		if got := tb.str(`document.querySelector('.detail-pane .tab[data-tab=request] .tab-badge')?.textContent || ''`); got == "" || got == "0" {
			t.Errorf("the request tab shows no findings count (%q)", got)
		}
		if !strings.Contains(tb.str(`document.querySelector('.detail-pane .checks').textContent`), "call.to_number") {
			t.Error("the findings list does not name call.to_number")
		}
		// Annotations, not rejections: the handler got it.
		if len(s.h.received()) != 1 {
			t.Errorf("handler got %d requests", len(s.h.received()))
		}
		tb.shot("checks")
	})

	// A capture whose answer a kill kept from being recorded is not a
	// failure: the list and the detail say "answer unknown", apart from a
	// capture whose delivery failed.
	t.Run("AnswerUnknownApartFromFailures", func(t *testing.T) {
		s := startStack(t)
		for _, body := range []string{`{"n":"unknown"}`, `{"n":"failed"}`} {
			if code := s.send(t, "/hook", []byte(body)); code != 200 {
				t.Fatalf("sender got %d", code)
			}
		}
		s.Agent.Flush(context.Background())
		caps := s.captures(t) // newest first
		unknown, failed := caps[1].ID, caps[0].ID
		set := func(id, status, errText string) *agentdb.Capture {
			c, err := s.AgentDB.Capture(context.Background(), id)
			if err != nil {
				t.Fatal(err)
			}
			c.Status, c.ResponseStatus, c.ResponseHeaders, c.ResponseBody, c.Error, c.Attempts = status, 0, "", nil, errText, 0
			return c
		}
		if _, err := s.AgentDB.WriteCaptures(context.Background(), nil, []*agentdb.Capture{
			set(unknown, agentdb.StatusUnknown, "answer unknown: the sender may have got the handler's answer"),
			set(failed, agentdb.StatusFailed, "connection refused"),
		}); err != nil {
			t.Fatal(err)
		}
		tb := newTab(t, browser, s.InspectorURL)
		tb.open("/")
		tb.waitFor("both rows", rowFor(unknown)+` && `+rowFor(failed))
		cell := func(id, sel string) string { return tb.str(rowFor(id) + `.querySelector('` + sel + `').textContent`) }
		if got := cell(unknown, ".c-status"); got != "?" {
			t.Errorf("answer-unknown row's status %q, want ?", got)
		}
		if got := cell(unknown, ".c-flags"); !strings.Contains(got, "answer unknown") || strings.Contains(got, "failed") {
			t.Errorf("answer-unknown row's flags %q", got)
		}
		if got := cell(failed, ".c-status"); got != "ERR" {
			t.Errorf("failed row's status %q, want ERR", got)
		}
		if got := cell(failed, ".c-flags"); !strings.Contains(got, "failed") || strings.Contains(got, "unknown") {
			t.Errorf("failed row's flags %q", got)
		}
		tb.click(fmt.Sprintf(`[data-view=requests] .vrow[data-key=%q] .c-path`, unknown))
		tb.waitFor("the detail", `location.pathname === '/requests/`+unknown+`' && !!document.querySelector('.detail-pane .tab[data-tab=response]')`)
		tb.click(`.detail-pane .tab[data-tab=response]`)
		tb.waitFor("the response tab saying answer unknown", `document.querySelector('.detail-pane .tab-response')?.textContent.includes('answer unknown')`)
		if tb.str(`document.querySelector('.detail-pane .tab-response .errbox') ? 'errbox' : ''`) != "" {
			t.Error("the answer-unknown capture's response is shown as an error")
		}
		tb.shot("answer-unknown")
	})

	t.Run("StatusBarFollowsTunnel", func(t *testing.T) {
		s := startStack(t)
		tb := newTab(t, browser, s.InspectorURL)
		tb.open("/")
		state := `document.querySelector('.topbar .state')?.textContent`
		tb.waitFor("connected", state+` === 'connected'`)
		if got := tb.str(`document.querySelector('.topbar .fwd').textContent`); got != s.h.srv.URL+"/hook" {
			t.Errorf("local target shows %q", got)
		}
		s.StopRelay()
		tb.waitFor("the state to leave connected", `['reconnecting', 'offline'].includes(`+state+`)`)
		tb.shot("relay-down")
		s.StartRelay()
		tb.waitFor("connected again", state+` === 'connected'`)
	})

	t.Run("PayloadIsText", func(t *testing.T) {
		s := startStack(t)
		tb := newTab(t, browser, s.InspectorURL)
		tb.open("/")
		tb.js(`window.__csp = []; document.addEventListener('securitypolicyviolation', e => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI))`)
		script := `<script>window.__pwned = 1; alert(1)</script>`
		img := `<img src=x onerror=window.__pwned=2;alert(2)>`
		body := event("call.started", uuid.NewString(), time.Now(), map[string]any{"note": script, "html": img})
		s.send(t, "/webhooks/"+`%3Cimg%20src=x%20onerror=alert(3)%3E`, body, "X-Evil", img)
		id := s.captures(t)[0].ID
		tb.waitFor("the capture", rowFor(id))
		tb.click(fmt.Sprintf(`[data-view=requests] .vrow[data-key=%q] .c-time`, id))
		tb.waitFor("the detail", `!!document.querySelector('.detail-pane .jtree')`)
		// Raw view too: the whole body as text.
		tb.click(`.detail-pane .seg-btn[data-mode=raw]`)
		tb.waitFor("the raw body", `!!document.querySelector('.detail-pane pre.raw')`)
		shown := tb.str(`document.querySelector('.detail-pane').textContent`)
		for _, want := range []string{script, img} {
			if !strings.Contains(shown, want) {
				t.Errorf("the detail does not show %q as text", want)
			}
		}
		tb.click(`.detail-pane .seg-btn[data-mode=pretty]`)
		tb.shot("hostile")
		if n := tb.str(`String(document.querySelectorAll('#app script, #app img:not(.brand img), #app iframe, #app [onerror], #app [onclick]').length)`); n != "0" {
			t.Errorf("%s elements were made from the payload", n)
		}
		if got := tb.str(`String(window.__pwned)`); got != "undefined" {
			t.Errorf("payload code ran: window.__pwned = %s", got)
		}
		if got := tb.str(`window.__csp.join('; ')`); got != "" {
			t.Errorf("the page tried to run something the CSP blocked: %s", got)
		}
		if n := tb.dialogs.Load(); n != 0 {
			t.Errorf("%d dialogs opened", n)
		}
	})
}
