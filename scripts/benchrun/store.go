package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"time"

	"github.com/calltap/calltap/inspector"
	"github.com/calltap/calltap/inspector/agent"
	"github.com/calltap/calltap/inspector/voice/callevent"
	"github.com/calltap/calltap/scripts/benchrun/load"
	"github.com/calltap/calltap/storage"
	"github.com/calltap/calltap/storage/agentdb"
	"github.com/google/uuid"
)

// The capture store part: how fast the agent's writer can save captures,
// and how fast the inspector's list answers over 10⁶ of them.

var cities = []string{"Austin", "Boston", "Denver", "Seattle", "Chicago"}

// callBodies returns the events of call k of a synthetic day of calls, as
// the voice service would send them: five per completed call, two per
// failed one (every tenth), each contact in one of five cities.
func callBodies(k int, start time.Time) []callevent.Payload {
	spec := callevent.CallSpec{
		MediaBaseURL: "http://media.invalid", // never fetched here; never resolvable either
		Start:        start.Add(time.Duration(k) * 2 * time.Second),
		Contact:      callevent.Contact{CustomFields: map[string]any{"city": cities[k%len(cities)], "plan": "trial"}},
		Variables:    map[string]any{"lead_id": fmt.Sprintf("L-%d", k)},
	}
	if k%10 == 9 {
		spec.Flow = callevent.FlowFailed
	}
	return spec.Events()
}

// captureOf builds the capture the agent would save for payload p, with a
// time-ordered (UUIDv7) id as the agent gives it.
func captureOf(p callevent.Payload, body []byte, at time.Time) *agentdb.Capture {
	id, err := uuid.NewV7()
	if err != nil { // only when the random source fails
		id = uuid.New()
	}
	return &agentdb.Capture{
		ID: id.String(), Source: agent.SourceTunnel, CreatedAt: at, Method: "POST", Path: "/voice",
		RequestHeaders: `[["Host","relay.example.com"],["Accept-Encoding","gzip"],["Content-Type","application/json"],["User-Agent","voice-service/1.0"]]`,
		Body:           body, Target: "http://127.0.0.1:3000/webhooks/voice",
		Event: p.Event, CallID: p.Call.CallID, DeliveryID: p.ID, OccurredAt: p.OccurredAt,
		Status: agentdb.StatusPending, MaxAttempts: 1, Duration: -1,
	}
}

func cmdStore(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("store", flag.ContinueOnError)
	out := fs.String("out", "", "results file")
	dur := fs.Duration("duration", 5*time.Second, "how long to write for the captures/s measure")
	size := fs.Int("size", 1_000_000, "captures in the store the queries run against")
	cache := addCacheFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	res, err := openResults(*out)
	if err != nil {
		return err
	}
	defer res.close()
	if err := measureWrites(ctx, res, *dur); err != nil {
		return err
	}
	path, err := bigStore(ctx, *cache.repo, *cache.dir, *size, *cache.batch)
	if err != nil {
		return err
	}
	return measureQueries(ctx, res, path, *size)
}

// measureWrites runs the agent's writer pattern against a fresh store:
// batches of up to 256 in one transaction each, every capture's response
// recorded in the following batch.
//
// The store indexes captures for search after saving them, into a file of
// its own (when the writer is idle, or beside it beyond a backlog of
// 50,000), so a burst is saved without indexing; a sustained load is held
// to the indexer's pace. Both are measured; the target is for the
// sustained one, which counts the time until every capture saved is also
// indexed. Stores are durable, as calltap's are by default (--sync full:
// each commit synced); one burst is measured again with --sync normal, to
// show what durability costs.
func measureWrites(ctx context.Context, res *results, dur time.Duration) error {
	dir, err := os.MkdirTemp("", "calltap-bench-store-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	pool, err := bodyPool()
	if err != nil {
		return err
	}
	for _, mode := range []writeMode{{false, false, storage.SyncFull}, {true, false, storage.SyncFull}, {true, true, storage.SyncFull}, {true, false, storage.SyncNormal}} {
		rate, err := mode.measure(ctx, dir, pool, dur)
		if err != nil {
			return err
		}
		res.add(mode.row(rate, pool))
	}
	return nil
}

const (
	writeBatch = 256
	burstMax   = 45_000 // a burst stays within the index's backlog
)

// bodyTmpl is a real event body; each capture gets its own copy with a
// unique delivery id, as each delivery has.
type bodyTmpl struct {
	p     callevent.Payload
	body  []byte
	stamp int
}

func bodyPool() ([]bodyTmpl, error) {
	var pool []bodyTmpl
	start := time.Now().Add(-24 * time.Hour)
	for k := range 400 {
		for _, p := range callBodies(k, start) {
			b, err := json.Marshal(p)
			if err != nil {
				return nil, err
			}
			pool = append(pool, bodyTmpl{p, b, bytes.Index(b, []byte(p.ID)) + 24})
		}
	}
	return pool, nil
}

// writeMode is one measure of measureWrites.
type writeMode struct {
	withResponse, keepIndex bool
	sync                    storage.SyncMode
}

// measure writes to a store of its own for dur, after a warm-up, and
// returns captures/s.
func (m writeMode) measure(ctx context.Context, dir string, pool []bodyTmpl, dur time.Duration) (float64, error) {
	opts := []agentdb.Option{agentdb.WithSync(m.sync)}
	if m.keepIndex {
		// What a sustained load beyond the backlog's bound meets: the
		// indexer works beside the writer from the first capture.
		opts = append(opts, agentdb.WithSearchBacklogMax(0))
	}
	db, err := agentdb.OpenAgent(ctx, filepath.Join(dir, fmt.Sprintf("agent-%v-%v-%s.db", m.withResponse, m.keepIndex, m.sync)), opts...)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	batches := make(chan []*agentdb.Capture, 4)
	stop := make(chan struct{})
	go produceBatches(pool, batches, stop)
	defer func() {
		close(stop)
		for range batches {
		}
	}()
	w := &storeWriter{db: db, mode: m, batches: batches}
	if err := w.write(ctx, time.Now().Add(500*time.Millisecond)); err != nil { // warm up
		return 0, err
	}
	w.n = 0
	t0 := time.Now()
	if err := w.write(ctx, t0.Add(dur)); err != nil {
		return 0, err
	}
	if m.keepIndex {
		if err := db.CatchUpSearch(ctx); err != nil {
			return 0, err
		}
	}
	return float64(w.n) / time.Since(t0).Seconds(), nil
}

// produceBatches builds captures the way the agent's read loop does,
// beside the writer, as in the agent, until stop.
func produceBatches(pool []bodyTmpl, batches chan<- []*agentdb.Capture, stop <-chan struct{}) {
	defer close(batches)
	n := 0
	for {
		b := make([]*agentdb.Capture, writeBatch)
		for i := range b {
			t := pool[n%len(pool)]
			body := bytes.Clone(t.body)
			load.StampHex(body, t.stamp, uint64(n))
			c := captureOf(t.p, body, time.Now().UTC())
			c.DeliveryID = c.DeliveryID[:24] + string(body[t.stamp:t.stamp+12])
			b[i] = c
			n++
		}
		select {
		case batches <- b:
		case <-stop:
			return
		}
	}
}

// storeWriter writes batches as the agent's writer does, each batch's
// answers recorded with the next.
type storeWriter struct {
	db       *agentdb.AgentStore
	mode     writeMode
	batches  <-chan []*agentdb.Capture
	prev     []*agentdb.Capture
	n, total int
}

func (w *storeWriter) write(ctx context.Context, until time.Time) error {
	for time.Now().Before(until) && (w.mode.keepIndex || w.total < burstMax) {
		ins := <-w.batches
		var upd []*agentdb.Capture
		if w.mode.withResponse {
			for _, c := range w.prev {
				upd = append(upd, answered(c))
			}
		}
		if _, err := w.db.WriteCaptures(ctx, ins, upd); err != nil {
			return err
		}
		w.prev = ins
		w.n += len(ins)
		w.total += len(ins)
	}
	return nil
}

func (m writeMode) row(rate float64, pool []bodyTmpl) row {
	var bytesSum int
	for _, t := range pool {
		bytesSum += len(t.body)
	}
	avg := float64(bytesSum) / float64(len(pool))
	shape := fmt.Sprintf("%.1f KB events, batches of %d", avg/1000, writeBatch)
	switch {
	case m.sync == storage.SyncNormal:
		return row{Measure: "Capture store: captures/s in a burst as above, each saved and its response recorded, with --sync normal (commits synced at checkpoints only; " + shape + ")",
			Calltap: fmtRate(rate, "/s")}
	case m.keepIndex:
		return row{Measure: "Capture store: captures/s sustained, each saved, its response recorded and indexed for search (" + shape + "; index beside the writer)",
			Calltap: fmtRate(rate, "/s"), Target: "≥ 20,000 /s", Met: verdict(rate >= 20000)}
	case m.withResponse:
		return row{Measure: "Capture store: captures/s in a burst (≤ 45,000, search index deferred), each saved and its response recorded (" + shape + "; every commit synced, --sync full)",
			Calltap: fmtRate(rate, "/s")}
	}
	return row{Measure: "Capture store: captures/s in a burst (≤ 45,000, search index deferred), insert only (" + shape + ")",
		Calltap: fmtRate(rate, "/s")}
}

// answered is c after the handler answered 200, as the agent records it.
func answered(c *agentdb.Capture) *agentdb.Capture {
	u := *c
	u.Status, u.ResponseStatus, u.Attempts = agentdb.StatusDelivered, 200, 1
	u.ResponseHeaders, u.ResponseBody = `[["Content-Length","17"],["Content-Type","application/json"]]`, []byte(`{"received":true}`)
	u.Duration, u.DeliveredAt = 900*time.Microsecond, time.Now().UTC()
	u.LastAttempt = &agentdb.Attempt{N: 1, At: c.CreatedAt, ResponseStatus: 200, Duration: u.Duration}
	return &u
}

// cacheFlags are the flags of the parts that build a synthetic store once
// and keep it between runs (store, routes).
type cacheFlags struct {
	repo, dir *string
	batch     *int
}

func addCacheFlags(fs *flag.FlagSet) cacheFlags {
	return cacheFlags{
		repo:  fs.String("repo", ".", "the calltap source tree (its migrations key the cached store)"),
		dir:   fs.String("cache", filepath.Join(os.TempDir(), "calltap-bench"), "where the built store is kept between runs"),
		batch: fs.Int("build-batch", 10_000, "captures per transaction while building the store"),
	}
}

// storeGenVersion changes when the synthetic store's content does.
const storeGenVersion = "3"

// bigStore returns a store of size captures, built once and kept under
// cacheDir, keyed by the agent schema's migrations: a schema change
// rebuilds it.
func bigStore(ctx context.Context, repo, cacheDir string, size, batch int) (string, error) {
	key, err := storeKey(repo, size)
	if err != nil {
		return "", err
	}
	path := filepath.Join(cacheDir, "store-"+key+".db")
	if _, err := os.Stat(path); err == nil {
		fmt.Fprintf(os.Stderr, "store: using cached %s\n", path)
		return path, nil
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", err
	}
	// Stores of older schemas are dead weight.
	old, _ := filepath.Glob(filepath.Join(cacheDir, "store-*"))
	for _, f := range old {
		os.Remove(f)
	}
	building := filepath.Join(cacheDir, "building-"+key+".db")
	for _, suffix := range []string{"", "-wal", "-shm"} {
		os.Remove(building + suffix)
		os.Remove(agentdb.SearchIndexPath(building) + suffix)
	}
	fmt.Fprintf(os.Stderr, "store: building %d captures in %s (once; kept for later runs)\n", size, path)
	if err := buildStore(ctx, building, size, batch); err != nil {
		return "", err
	}
	return path, moveStore(building, path)
}

// storeKey names a synthetic store by the agent schema's migrations, the
// generator's version and the size.
func storeKey(repo string, size int) (string, error) {
	h := sha256.New()
	files, err := filepath.Glob(filepath.Join(repo, "storage", "agentdb", "migrations", "*.sql"))
	if err != nil || len(files) == 0 {
		return "", fmt.Errorf("no agent migrations under %s: run from the calltap tree or pass --repo", repo)
	}
	sort.Strings(files)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", filepath.Base(f), len(b))
		h.Write(b)
	}
	fmt.Fprintf(h, "gen %s size %d", storeGenVersion, size)
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// buildStore writes size captures of past calls, 100 ms apart, to a new
// store at path, with its search index complete.
func buildStore(ctx context.Context, path string, size, batch int) error {
	db, err := agentdb.OpenAgent(ctx, path)
	if err != nil {
		return err
	}
	batches := make(chan []*agentdb.Capture, 2)
	go pastCaptures(ctx, size, batch, batches)
	t0 := time.Now()
	n := 0
	for b := range batches {
		if _, err := db.WriteCaptures(ctx, b, nil); err != nil {
			db.Close()
			return err
		}
		n += len(b)
		if n%100_000 < len(b) {
			fmt.Fprintf(os.Stderr, "store: %d captures, %.0f /s\n", n, float64(n)/time.Since(t0).Seconds())
		}
	}
	if err := ctx.Err(); err != nil {
		db.Close()
		return err
	}
	if err := db.CatchUpSearch(ctx); err != nil { // the store is cached with its search index complete
		db.Close()
		return err
	}
	return db.Close()
}

// pastCaptures sends size delivered captures of past calls, in batches.
func pastCaptures(ctx context.Context, size, batch int, batches chan<- []*agentdb.Capture) {
	defer close(batches)
	start := time.Now().Add(-30 * 24 * time.Hour).UTC()
	var b []*agentdb.Capture
	n := 0
	for k := 0; n < size; k++ {
		for _, p := range callBodies(k, start) {
			if n == size {
				break
			}
			body, _ := json.Marshal(p)
			c := captureOf(p, body, start.Add(time.Duration(n)*100*time.Millisecond))
			c.Status = agentdb.StatusDelivered
			b = append(b, c)
			n++
			if len(b) < batch {
				continue
			}
			select {
			case batches <- b:
			case <-ctx.Done():
				return
			}
			b = nil
		}
	}
	if len(b) > 0 {
		batches <- b
	}
}

// moveStore renames a built store, its search index file and any WAL
// left, to path.
func moveStore(building, path string) error {
	for _, f := range [][2]string{{building, path}, {agentdb.SearchIndexPath(building), agentdb.SearchIndexPath(path)}} {
		for _, suffix := range []string{"-wal", "-shm"} {
			if _, err := os.Stat(f[0] + suffix); err == nil {
				if err := os.Rename(f[0]+suffix, f[1]+suffix); err != nil {
					return err
				}
			}
		}
	}
	if err := os.Rename(agentdb.SearchIndexPath(building), agentdb.SearchIndexPath(path)); err != nil {
		return err
	}
	return os.Rename(building, path)
}

// measureQueries serves the store through the inspector's real HTTP
// handler on loopback and times the list endpoint's first page under each
// filter the UI offers.
func measureQueries(ctx context.Context, res *results, path string, size int) error {
	db, err := agentdb.OpenAgent(ctx, path)
	if err != nil {
		return err
	}
	defer db.Close()
	a, err := agent.New(agent.Config{Store: db})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: inspector.NewServer(inspector.ServerConfig{Agent: a})}
	go srv.Serve(ln)
	defer srv.Close()
	base := "http://" + ln.Addr().String() + "/api/v1/ext/webhooks/"

	// Pick filter values from the middle of the store.
	mid, _, err := db.Captures(ctx, agentdb.CaptureFilter{Page: storage.Page{Limit: 1, Offset: size / 2}})
	if err != nil || len(mid) == 0 {
		return fmt.Errorf("store has no capture at offset %d: %v", size/2, err)
	}
	full, err := db.Capture(ctx, mid[0].ID)
	if err != nil {
		return err
	}
	var ev struct {
		Call struct {
			Variables struct {
				LeadID string `json:"lead_id"`
			} `json:"variables"`
		} `json:"call"`
	}
	json.Unmarshal(full.Body, &ev)
	queries := []struct{ name, query string }{
		{"first list page (50, newest first, with total count)", ""},
		{"filter by call id", "?call_id=" + full.CallID},
		{"filter by event (call.ended)", "?event=call.ended"},
		{"text search, rare term (one call's lead id)", "?q=" + ev.Call.Variables.LeadID},
		{"text search, common term (a city)", "?q=Denver"},
	}
	for _, q := range queries {
		var times []time.Duration
		var count int
		for i := range 12 {
			t0 := time.Now()
			b, err := getBody(base + q.query)
			el := time.Since(t0)
			if err != nil {
				return fmt.Errorf("%s: %v: %s", q.name, err, b)
			}
			var env struct {
				Data struct {
					Count   int               `json:"count"`
					Results []json.RawMessage `json:"results"`
				} `json:"data"`
			}
			if err := json.Unmarshal(b, &env); err != nil {
				return err
			}
			if len(env.Data.Results) == 0 {
				return fmt.Errorf("%s: no results", q.name)
			}
			count = env.Data.Count
			if i >= 2 { // the first two warm the page cache
				times = append(times, el)
			}
		}
		slices.Sort(times)
		med := times[len(times)/2]
		res.add(row{Measure: fmt.Sprintf("Inspector list at %s captures: %s → %s matches (%.1f%%)", fmtCount(size), q.name, fmtCount(count), 100*float64(count)/float64(size)),
			Calltap: fmtDur(med) + " (max " + fmtDur(times[len(times)-1]) + ")", Target: "≤ 20 ms", Met: verdict(med <= 20*time.Millisecond)})
	}
	return nil
}
