package service

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/calltap/calltap/inspector/voice/emulator"
	"github.com/calltap/calltap/relay/polltest"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// pageLog records the delivery-log requests that reach the emulator and
// the ids each page served.
type pageLog struct {
	mu    sync.Mutex
	reqs  []map[string]string // guarded by mu: limit and offset asked for
	ids   []string            // guarded by mu: every id served, in order
	limit []int               // guarded by mu: the limit each page came back with
}

func (l *pageLog) wrap(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if !strings.HasSuffix(r.URL.Path, "/webhooks/") {
		next.ServeHTTP(w, r)
		return
	}
	rec := httptest.NewRecorder()
	next.ServeHTTP(rec, r)
	var env struct {
		Data struct {
			Limit   int `json:"limit"`
			Results []struct {
				ID string `json:"id"`
			} `json:"results"`
		} `json:"data"`
	}
	json.Unmarshal(rec.Body.Bytes(), &env)
	l.mu.Lock()
	l.reqs = append(l.reqs, map[string]string{"limit": r.URL.Query().Get("limit"), "offset": r.URL.Query().Get("offset")})
	l.limit = append(l.limit, env.Data.Limit)
	for _, x := range env.Data.Results {
		l.ids = append(l.ids, x.ID)
	}
	l.mu.Unlock()
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.Code)
	w.Write(rec.Body.Bytes())
}

func (l *pageLog) reset() {
	l.mu.Lock()
	l.reqs, l.ids, l.limit = nil, nil, nil
	l.mu.Unlock()
}

func idSet(t *testing.T, ds []Delivery) map[string]bool {
	t.Helper()
	set := map[string]bool{}
	for _, d := range ds {
		if set[d.ID] {
			t.Fatalf("delivery %s returned twice", d.ID)
		}
		set[d.ID] = true
	}
	return set
}

func TestWalkFollowsTheLimitReceived(t *testing.T) {
	e := startEmu(t, func(c *emulator.Config) { c.Seed = 120 })
	var log pageLog
	e.setWrap(log.wrap)
	c := e.client(roKey)
	ctx := ctxT(t)

	var last Progress
	all, err := c.Deliveries(ctx, Filter{}, func(p Progress) { last = p })
	if err != nil {
		t.Fatal(err)
	}
	if last.Count <= 2*PageSize || len(all) != last.Count || len(idSet(t, all)) != last.Count {
		t.Fatalf("walk returned %d of count %d; want every seeded delivery (more than %d)", len(all), last.Count, 2*PageSize)
	}
	pages := (last.Count + PageSize - 1) / PageSize
	if len(log.reqs) != pages || last.Pages != pages {
		t.Fatalf("%d requests (%d reported) for %d rows; want %d", len(log.reqs), last.Pages, last.Count, pages)
	}
	for i, q := range log.reqs {
		if q["limit"] != "200" || q["offset"] != strconv.Itoa(i*PageSize) {
			t.Errorf("request %d asked %v; want limit 200 offset %d", i, q, i*PageSize)
		}
	}

	// Asking for more than the documented maximum: served 200 a page
	// without an error, and the walk moves by what it was served.
	log.reset()
	big, err := c.Deliveries(ctx, Filter{PageSize: 500}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(idSet(t, big)) != len(all) {
		t.Fatalf("limit=500 walk: %d deliveries, want %d", len(big), len(all))
	}
	for i, q := range log.reqs {
		if q["limit"] != "500" || q["offset"] != strconv.Itoa(i*200) || log.limit[i] != 200 {
			t.Errorf("request %d: asked %v, served limit %d; want offset %d and 200", i, q, log.limit[i], i*200)
		}
	}
	if len(log.reqs) != pages {
		t.Errorf("limit=500 walk took %d requests, want %d", len(log.reqs), pages)
	}

	// A window: only deliveries created since, and the walk (newest first)
	// stops once it is past them.
	since := time.Now().Add(-3 * time.Hour)
	log.reset()
	recent, err := c.Deliveries(ctx, Filter{Since: since, PageSize: 10}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	for _, d := range all {
		if !d.CreatedAt.Before(since) {
			want++
		}
	}
	if want == 0 || len(recent) != want {
		t.Fatalf("since 3h: %d deliveries, want %d", len(recent), want)
	}
	for _, d := range recent {
		if d.CreatedAt.Before(since) {
			t.Fatalf("delivery %s created %s is before the window", d.ID, d.CreatedAt)
		}
	}
	if n := len(log.reqs); n > want/10+2 {
		t.Errorf("since 3h: %d pages of 10 for %d deliveries; the walk did not stop past the window", n, want)
	}
}

// Rows created while a walk is under way shift the pages: the walk must
// return each delivery once and miss none, including the new ones.
func TestWalkWithRowsInsertedDuringIt(t *testing.T) {
	e := startEmu(t, func(c *emulator.Config) { c.Seed = 30 })
	tg := newTarget(t)
	var log pageLog
	e.setWrap(log.wrap)
	c := e.client(roKey)
	ctx := ctxT(t)

	var dispatched []string
	got, err := c.Deliveries(ctx, Filter{PageSize: 20}, func(p Progress) {
		if p.Pages <= 4 {
			// Three new deliveries before the next page: the rows the next
			// page would have started with are pushed back onto it.
			for range 3 {
				dispatched = append(dispatched, e.dispatch(map[string]any{
					"to_number": "+12025550143", "event_webhook_url": tg.URL, "event_webhook_events": []string{"call.started"},
				}))
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	set := idSet(t, got)

	log.mu.Lock()
	served := map[string]int{}
	twice := 0
	for _, id := range log.ids {
		if served[id]++; served[id] == 2 {
			twice++
		}
	}
	log.mu.Unlock()
	if twice == 0 {
		t.Fatal("no row was served twice: the test did not make the offsets drift")
	}

	// The truth, read when nothing moves any more.
	truth, err := c.Deliveries(ctx, Filter{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(truth) != len(got) {
		t.Errorf("walk returned %d deliveries; the log holds %d", len(got), len(truth))
	}
	for _, d := range truth {
		if !set[d.ID] {
			t.Errorf("delivery %s (%s, call %s) lost by the walk", d.ID, d.Event, d.CallID)
		}
	}
	calls := map[string]bool{}
	for _, d := range got {
		calls[d.CallID] = true
	}
	for _, id := range dispatched {
		if !calls[id] {
			t.Errorf("the delivery of call %s, created during the walk, is missing", id)
		}
	}
}

func TestDeliveryReplayAndMedia(t *testing.T) {
	e := startEmu(t, nil)
	tg := newTarget(t)
	c := e.client(rwKey)
	ctx := ctxT(t)
	callID := e.dispatch(map[string]any{"to_number": "+12025550143", "event_webhook_url": tg.URL + "/hooks?x=1"})
	polltest.Until(t, 15*time.Second, func() bool { return len(tg.requests()) >= 5 }, "five events at the target")

	ds, err := c.Deliveries(ctx, Filter{CallID: callID}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 5 {
		t.Fatalf("call_id filter: %d deliveries, want 5", len(ds))
	}
	for _, r := range tg.requests() {
		var d *Delivery
		polltest.Until(t, 10*time.Second, func() bool {
			d, err = c.Delivery(ctx, r.id)
			if err != nil {
				t.Fatal(err)
			}
			return d.Status == "delivered"
		}, "delivery "+r.id+" settled")
		if !bytes.Equal(d.Payload, r.body) {
			t.Errorf("%s: payload differs from the bytes sent\n got %s\nwant %s", r.id, d.Payload, r.body)
		}
		if d.ID != r.id || d.CallID != callID || d.Attempts != 1 || d.ResponseStatus == nil || *d.ResponseStatus != 200 ||
			d.CreatedAt.IsZero() || d.DeliveredAt.IsZero() || len(d.AttemptLog) != 1 || !strings.HasPrefix(d.URL, tg.URL+"/hooks") {
			t.Errorf("record: %+v", d)
		}
	}

	first := tg.requests()[0]
	res, err := c.Replay(ctx, first.id)
	if err != nil {
		t.Fatal(err)
	}
	if res.ID != first.id || !res.Queued {
		t.Fatalf("replay result %+v", res)
	}
	polltest.Until(t, 10*time.Second, func() bool { return len(tg.requests()) == 6 }, "the replay at the target")
	if again := tg.requests()[5]; !bytes.Equal(again.body, first.body) {
		t.Fatal("the replay changed the payload")
	}

	m, err := c.Media(ctx, callID)
	if err != nil {
		t.Fatal(err)
	}
	if m.CallID != callID || m.ExpiresIn <= 0 || !strings.HasPrefix(m.RecordingURL, e.url) || len(m.Raw) == 0 {
		t.Fatalf("media %+v", m)
	}
	resp, err := http.Get(m.RecordingURL)
	if err != nil {
		t.Fatal(err)
	}
	wav, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.HasPrefix(wav, []byte("RIFF")) {
		t.Fatalf("recording: %d %q", resp.StatusCode, wav[:min(len(wav), 8)])
	}
}

func TestErrorsAreOneClearLine(t *testing.T) {
	e := startEmu(t, nil)
	ctx := ctxT(t)
	const unknown = "8a1f6a9e-0000-4000-8000-000000000000"
	check := func(name string, err error, kind error, want string) {
		t.Helper()
		if !errors.Is(err, kind) {
			t.Errorf("%s: error %v is not %v", name, err, kind)
			return
		}
		if msg := err.Error(); !strings.Contains(msg, want) || strings.ContainsAny(msg, "\r\n") {
			t.Errorf("%s: %q, want one line containing %q", name, msg, want)
		}
	}

	_, err := e.client("wrong_key").Deliveries(ctx, Filter{}, nil)
	check("401", err, ErrUnauthorized, "the API key was refused (401): check CALLTAP_API_KEY")
	var apiErr *Error
	if !errors.As(err, &apiErr) || apiErr.Status != 401 || apiErr.Code != "unauthorized" {
		t.Errorf("401: %+v", apiErr)
	}

	_, err = e.client(roKey).Replay(ctx, unknown)
	check("403", err, ErrForbidden, "may not POST /webhooks/replay/ (403: this API key lacks the webhooks:write scope)")

	_, err = e.client(roKey).Delivery(ctx, unknown)
	check("404 delivery", err, ErrNotFound, "delivery "+unknown+" not found (404)")
	_, err = e.client(rwKey).Replay(ctx, unknown)
	check("404 replay", err, ErrNotFound, "delivery "+unknown+" not found (404)")
	_, err = e.client(rwKey).Media(ctx, unknown)
	check("404 media", err, ErrNotFound, "the media of call "+unknown+" not found (404)")

	wrongBase, _ := New(e.url+"/api/v9/ext", roKey)
	_, err = wrongBase.Deliveries(ctx, Filter{}, nil)
	check("404 endpoint", err, ErrNotFound, "GET /webhooks/: not found (404): check --base-url")

	html := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		io.WriteString(w, "<html>welcome</html>")
	}))
	defer html.Close()
	notAPI, _ := New(html.URL, roKey)
	_, err = notAPI.Deliveries(ctx, Filter{}, nil)
	check("not the API", err, ErrNotService, "answered HTTP 200 without the service's JSON envelope: check --base-url")

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String() + "/api/v1/ext/"
	ln.Close()
	down, _ := New(dead, roKey)
	_, err = down.Delivery(ctx, unknown)
	check("network", err, ErrNetwork, "cannot reach the service at "+dead+": ")
	if !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("network: %q does not say the connection was refused", err)
	}

	if _, err := e.client(roKey).Delivery(ctx, "../contacts"); err == nil {
		t.Error("an id with a slash was sent")
	}
}

func TestRateLimitIsRetriedWithinBounds(t *testing.T) {
	e := startEmu(t, nil)
	ctx := ctxT(t)
	var mu sync.Mutex
	n, refuse, after := 0, 0, "0"
	e.setWrap(func(w http.ResponseWriter, r *http.Request, next http.Handler) {
		mu.Lock()
		n++
		busy := n <= refuse
		mu.Unlock()
		if busy {
			w.Header().Set("Retry-After", after)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(429)
			io.WriteString(w, `{"status":false,"message":"slow down","data":null,"error":{"code":"rate_limited","message":"slow down"}}`)
			return
		}
		next.ServeHTTP(w, r)
	})
	set := func(r int, a string) {
		mu.Lock()
		n, refuse, after = 0, r, a
		mu.Unlock()
	}
	requests := func() int { mu.Lock(); defer mu.Unlock(); return n }
	c := e.client(roKey)

	set(2, "0")
	if _, err := c.Deliveries(ctx, Filter{}, nil); err != nil {
		t.Fatalf("two 429s then an answer: %v", err)
	}
	if requests() != 3 {
		t.Errorf("%d requests, want 3", requests())
	}

	set(100, "0")
	_, err := c.Deliveries(ctx, Filter{}, nil)
	if !errors.Is(err, ErrRateLimited) || !strings.Contains(err.Error(), "rate limiting requests (429) and still was after 3 retries") {
		t.Fatalf("429 for ever: %v", err)
	}
	if requests() != 4 {
		t.Errorf("%d requests, want 1 + 3 retries", requests())
	}

	// A wait longer than the client will sleep: no retry, and the message
	// says when to come back.
	set(100, "120")
	_, err = c.Deliveries(ctx, Filter{}, nil)
	if !errors.Is(err, ErrRateLimited) || !strings.HasSuffix(err.Error(), "try again in 2m0s") || requests() != 1 {
		t.Fatalf("Retry-After 120: %v after %d requests", err, requests())
	}
}

func TestRetryAfterForms(t *testing.T) {
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"7", 7 * time.Second, true},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{now.Add(-time.Minute).Format(http.TimeFormat), 0, true},
		{"", 0, false},
		{"soon", 0, false},
		{"-3", 0, false},
	} {
		got, ok := retryAfter(c.in, now)
		if got != c.want || ok != c.ok {
			t.Errorf("retryAfter(%q) = %s %v, want %s %v", c.in, got, ok, c.want, c.ok)
		}
	}
}

func TestNewChecksItsArguments(t *testing.T) {
	for _, c := range []struct{ base, key string }{
		{"ftp://example.com/api/v1/ext/", "k"},
		{"example.com/api/v1/ext", "k"},
		{"https://example.com/api/v1/ext/?x=1", "k"},
		{"https://example.com/api/v1/ext/", ""},
		{"https://example.com/api/v1/ext/", "two words"},
	} {
		if _, err := New(c.base, c.key); err == nil {
			t.Errorf("New(%q, %q) accepted", c.base, c.key)
		}
	}
	c, err := New("https://example.com/api/v1/ext", "k")
	if err != nil || c.BaseURL() != "https://example.com/api/v1/ext/" {
		t.Fatalf("New: %v %v", c, err)
	}
}

func TestExactPayload(t *testing.T) {
	for in, want := range map[string]string{
		`{"id":"a", "x": [1, 2]}`:      `{"id":"a", "x": [1, 2]}`,
		`"{\"id\":\"a\",\"x\":\"<\"}"`: `{"id":"a","x":"<"}`,
		`null`:                         ``,
		``:                             ``,
	} {
		if got := string(exactPayload(json.RawMessage(in))); got != want {
			t.Errorf("exactPayload(%s) = %s, want %s", in, got, want)
		}
	}
}
