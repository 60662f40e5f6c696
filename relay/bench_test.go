package relay_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/calltap/calltap/inspector/inspectortest"
	"github.com/calltap/calltap/relay"
)

// benchEvent is a call event of about 2 KB whose delivery id differs per
// request (as the voice service's do), so the agent's duplicate check and
// full-text index see realistic input.
func benchEvent(n uint64) []byte {
	pad := strings.Repeat("n", 1400)
	return fmt.Appendf(nil, `{"id":"0b6f3c0e-8d5f-4a43-9b1c-%012x","event":"call.ended","occurred_at":"2026-11-22T10:00:00.000000+00:00",`+
		`"call":{"call_id":"7b1d3a52-1111-4a43-9b1c-2f4e0c1d9a77","direction":"outbound","status":"completed","from_number":"+14155550100",`+
		`"to_number":"+12025550143","variables":{"lead_id":"L-1001","notes":%q}}}`, n, pad)
}

// BenchmarkTunnel measures a whole request through calltap in one process:
// sender → relay → websocket → agent (capture saved in SQLite) → local
// handler and back. Run it with -cpuprofile to see the hot path of relay
// and agent together.
func BenchmarkTunnel(b *testing.B) {
	for _, bc := range []struct {
		name  string
		size  int
		conns int
	}{
		{"2KB/c=1", 2 << 10, 1},
		{"2KB/c=32", 2 << 10, 32},
		{"1MiB/c=32", 1 << 20, 32},
	} {
		b.Run(bc.name, func(b *testing.B) {
			reply := []byte(`{"received":true}`)
			h := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				w.Write(reply)
			}))
			defer h.Close()
			st := inspectortest.Start(b, inspectortest.Options{ForwardTo: h.URL + "/webhooks", Relay: func(c *relay.Config) {
				// The abuse limits would throttle a benchmark: that is their job.
				c.RateLimit, c.RateBurst, c.MaxInFlight = 1e9, 1e9, 1e5
			}})
			client := &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 64}}
			var seq atomic.Uint64
			body := func() []byte {
				if bc.size < 1<<20 {
					return benchEvent(seq.Add(1))
				}
				return bytes.Repeat([]byte{0xff}, bc.size)
			}
			do := func(b []byte) error {
				resp, err := client.Post(st.TunnelURL+"/voice", "application/json", bytes.NewReader(b))
				if err != nil {
					return err
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					return fmt.Errorf("status %d", resp.StatusCode)
				}
				return nil
			}
			big := body()
			b.SetBytes(int64(bc.size))
			b.ReportAllocs()
			b.ResetTimer()
			if bc.conns == 1 {
				for b.Loop() {
					p := big
					if bc.size < 1<<20 {
						p = body()
					}
					if err := do(p); err != nil {
						b.Fatal(err)
					}
				}
			} else {
				// RunParallel starts parallelism × GOMAXPROCS goroutines.
				b.SetParallelism(max(1, bc.conns/max(1, runtimeProcs())))
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						p := big
						if bc.size < 1<<20 {
							p = body()
						}
						if err := do(p); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
		})
	}
}

func runtimeProcs() int { return runtime.GOMAXPROCS(0) }
