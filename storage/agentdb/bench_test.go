package agentdb_test

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/calltap/calltap/storage"
	"github.com/calltap/calltap/storage/agentdb"
)

// The capture store's hot paths: the agent's batched writes and the
// inspector's list queries. `make bench` runs these; compare runs with
// benchstat.

var benchEvents = []string{"call.started", "call.connected", "call.ended", "call.recording_available", "call.analysis_completed", "call.failed"}

// benchCapture is capture i as the agent builds it from a ~2 KB call event
// of the voice service: five events per call, indexed by event and call id.
func benchCapture(i int) *agentdb.Capture {
	event := benchEvents[i%5]
	if i%50 == 49 {
		event = "call.failed"
	}
	callID := fmt.Sprintf("7b1d3a52-%04x-4a43-9b1c-%012x", (i/5)&0xffff, i/5)
	id := fmt.Sprintf("0b6f3c0e-8d5f-4a43-9b1c-%012x", i)
	city := []string{"Austin", "Boston", "Denver", "Seattle", "Chicago"}[i/5%5]
	body := fmt.Sprintf(`{"id":%q,"event":%q,"occurred_at":"2026-11-22T10:00:00.000000+00:00","call":{"call_id":%q,`+
		`"direction":"outbound","status":"completed","from_number":"+14155550100","to_number":"+1202555%04d","agent":{"name":"Ava"},`+
		`"contact":{"name":"Jordan Lee","custom_fields":{"city":%q,"plan":"trial"}},"variables":{"lead_id":"L-%d"}},`+
		`"analysis":{"summary":"Ava called Jordan Lee about the trial plan. Jordan was interested and asked for a follow-up call next week.",`+
		`"notes":%q}}`, id, event, callID, i%10000, city, i, strings.Repeat("lorem ipsum dolor sit amet ", 50))
	return &agentdb.Capture{
		ID: id, Source: "tunnel", CreatedAt: time.Unix(1795335117, 0).Add(time.Duration(i) * time.Millisecond).UTC(),
		Method: "POST", Path: "/voice", RequestHeaders: `[["Host","relay.example.com"],["Content-Type","application/json"],["User-Agent","voice-service/1.0"]]`,
		Body: []byte(body), Target: "http://127.0.0.1:3000/webhooks/voice", Event: event, CallID: callID, DeliveryID: id,
		Status: agentdb.StatusPending, MaxAttempts: 1, Duration: -1,
	}
}

// responded is c after the local handler answered, as the agent records it.
func responded(c *agentdb.Capture) *agentdb.Capture {
	u := *c
	u.Status, u.ResponseStatus, u.Attempts = agentdb.StatusDelivered, 200, 1
	u.ResponseHeaders, u.ResponseBody = `[["Content-Type","application/json"]]`, []byte(`{"received":true}`)
	u.Duration, u.DeliveredAt = 850*time.Microsecond, c.CreatedAt.Add(time.Millisecond)
	u.LastAttempt = &agentdb.Attempt{N: 1, At: c.CreatedAt, ResponseStatus: 200, Duration: u.Duration}
	return &u
}

func openBenchDB(b *testing.B, dir string, opts ...agentdb.Option) *agentdb.AgentStore {
	b.Helper()
	db, err := agentdb.OpenAgent(context.Background(), filepath.Join(dir, "agent.db"), opts...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	return db
}

// BenchmarkWriteCaptures is the agent's writer: one transaction per batch
// of whatever queued up. ns/op is per capture. "insert+update" also
// records each capture's response in a later batch, as the agent does for
// every live request. Stores are durable (storage.SyncFull), as by
// default; "sync=normal" repeats a few cases with commits synced only at
// checkpoints, to show what durability costs.
func BenchmarkWriteCaptures(b *testing.B) {
	benchWriteCaptures(b, nil, nil)
	b.Run("sync=normal", func(b *testing.B) {
		benchWriteCaptures(b, map[string]bool{"insert+update/batch=1": true, "insert+update/batch=256": true, "1MiB-binary": true},
			[]agentdb.Option{agentdb.WithSync(storage.SyncNormal)})
	})
}

// benchWriteCaptures runs the cases of BenchmarkWriteCaptures named in
// only (nil: all of them) on stores opened with opts.
func benchWriteCaptures(b *testing.B, only map[string]bool, opts []agentdb.Option) {
	ctx := context.Background()
	for _, bc := range []struct {
		name   string
		batch  int
		update bool
	}{
		{"insert/batch=1", 1, false},
		{"insert/batch=32", 32, false},
		{"insert/batch=256", 256, false},
		{"insert+update/batch=1", 1, true},
		{"insert+update/batch=32", 32, true},
		{"insert+update/batch=256", 256, true},
	} {
		if only != nil && !only[bc.name] {
			continue
		}
		b.Run(bc.name, func(b *testing.B) {
			db := openBenchDB(b, b.TempDir(), opts...)
			pool := make([]*agentdb.Capture, 1024)
			for i := range pool {
				pool[i] = benchCapture(i)
			}
			b.SetBytes(int64(len(pool[0].Body)))
			b.ResetTimer()
			var prev []*agentdb.Capture
			for done := 0; done < b.N; {
				n := min(bc.batch, b.N-done)
				ins := make([]*agentdb.Capture, n)
				for j := range ins {
					c := *pool[(done+j)%len(pool)]
					c.ID = fmt.Sprintf("%s-%d", c.ID[:24], done+j) // unique, as each delivery is
					c.DeliveryID = c.ID
					ins[j] = &c
				}
				var upd []*agentdb.Capture
				if bc.update {
					for _, c := range prev {
						upd = append(upd, responded(c))
					}
				}
				if _, err := db.WriteCaptures(ctx, ins, upd); err != nil {
					b.Fatal(err)
				}
				prev = ins
				done += n
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "captures/s")
		})
	}
	// A large body costs its bytes, and for text also the full-text index.
	for _, bc := range []struct {
		name string
		body []byte
	}{
		{"1MiB-text", bytes.Repeat([]byte("lorem ipsum dolor sit amet "), (1<<20)/27)},
		{"1MiB-binary", bytes.Repeat([]byte{0xff}, 1<<20)},
	} {
		for _, update := range []bool{false, true} {
			name := bc.name
			if update {
				name += "+update" // its response recorded in the next batch
			}
			if only != nil && !only[name] {
				continue
			}
			b.Run(name, func(b *testing.B) {
				db := openBenchDB(b, b.TempDir(), opts...)
				b.SetBytes(int64(len(bc.body)))
				i := 0
				var prev *agentdb.Capture
				for b.Loop() {
					c := benchCapture(i)
					c.Body = bc.body
					i++
					var upd []*agentdb.Capture
					if update && prev != nil {
						upd = append(upd, responded(prev))
					}
					if _, err := db.WriteCaptures(ctx, []*agentdb.Capture{c}, upd); err != nil {
						b.Fatal(err)
					}
					prev = c
				}
			})
		}
	}
}

// fillBenchStore saves captures 0 to size-1 (benchCapture) to db in
// batches, and with answered each one's response too, as the agent
// records it once the handler answered.
func fillBenchStore(b *testing.B, db *agentdb.AgentStore, size int, answered bool) {
	b.Helper()
	ctx := context.Background()
	const batch = 5000
	for i := 0; i < size; i += batch {
		cs := make([]*agentdb.Capture, min(batch, size-i))
		var answers []*agentdb.Capture
		for j := range cs {
			cs[j] = benchCapture(i + j)
			if answered {
				answers = append(answers, responded(cs[j]))
			}
		}
		if _, err := db.WriteCaptures(ctx, cs, nil); err != nil {
			b.Fatal(err)
		}
		if !answered {
			continue
		}
		if _, err := db.WriteCaptures(ctx, nil, answers); err != nil {
			b.Fatal(err)
		}
	}
}

// benchStoreSize is the store the list queries run against here; the
// suite (scripts/bench) measures the same queries at 10⁶ captures.
const benchStoreSize = 50_000

// BenchmarkCaptures is the inspector's list endpoint: one page of 50 with
// its total count, unfiltered and under each filter.
func BenchmarkCaptures(b *testing.B) {
	ctx := context.Background()
	db := openBenchDB(b, b.TempDir())
	fillBenchStore(b, db, benchStoreSize, false)
	// Searches are measured on a store whose full-text index has caught up,
	// as it has once the agent's writer was idle.
	if err := db.CatchUpSearch(ctx); err != nil {
		b.Fatal(err)
	}
	mid := benchCapture(benchStoreSize / 2)
	page := storage.Page{Limit: 50}
	for _, bc := range []struct {
		name string
		f    agentdb.CaptureFilter
	}{
		{"first-page", agentdb.CaptureFilter{Page: page}},
		{"call-id", agentdb.CaptureFilter{CallID: mid.CallID, Page: page}},
		{"event", agentdb.CaptureFilter{Event: "call.ended", Page: page}},
		{"text-rare", agentdb.CaptureFilter{Text: "L-" + fmt.Sprint(benchStoreSize/2), Page: page}},
		{"text-common", agentdb.CaptureFilter{Text: "Denver", Page: page}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				rows, count, err := db.Captures(ctx, bc.f)
				if err != nil {
					b.Fatal(err)
				}
				if len(rows) == 0 || count == 0 {
					b.Fatalf("no rows for %+v", bc.f)
				}
			}
		})
	}
}

// walkStoreSize is the store BenchmarkEachCapture walks: enough pages to
// weigh a page's cost against a capture's, small enough to build quickly;
// the suite (scripts/bench) times routes check, which walks this way, at
// 10⁵ captures.
const walkStoreSize = 10_000

// BenchmarkEachCapture is the walk of export, replay-call and routes check:
// every capture, bodies and answers included, a page at a time. ns/op is
// a walk of the whole store; ns/capture is per capture.
func BenchmarkEachCapture(b *testing.B) {
	ctx := context.Background()
	db := openBenchDB(b, b.TempDir())
	fillBenchStore(b, db, walkStoreSize, true)
	walked := 0
	for b.Loop() {
		n, err := db.EachCapture(ctx, agentdb.CaptureFilter{}, func(c *agentdb.Capture) error {
			if len(c.Body) == 0 || len(c.ResponseBody) == 0 {
				return fmt.Errorf("capture %s walked without its bodies", c.ID)
			}
			return nil
		})
		if err != nil || n != walkStoreSize {
			b.Fatalf("walked %d of %d: %v", n, walkStoreSize, err)
		}
		walked += n
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(walked), "ns/capture")
}
