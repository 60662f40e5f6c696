package relay_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/calltap/calltap/cmd/stacktest"
	"github.com/calltap/calltap/relay"
	"github.com/calltap/calltap/relay/tunnel"
	"github.com/calltap/calltap/relay/wire"
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
			st := stacktest.Start(b, stacktest.Options{ForwardTo: h.URL + "/webhooks", Relay: func(c *relay.Config) {
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

// instantAgent acknowledges and answers every request at once, with no
// store and no local handler: what is left is the relay's own cost.
type instantAgent struct{ reply []byte }

func (a instantAgent) ServeTunnel(r *wire.Request, s *tunnel.Stream) {
	s.Ack()
	if !r.Queued {
		s.Respond(&wire.Response{Status: http.StatusOK, Header: wire.Header{{Name: "Content-Type", Value: "application/json"}}, Body: a.reply})
	}
	s.Release()
}

// BenchmarkRelay is sender → relay → websocket → an agent that answers at
// once: the relay and the wire protocol without the capture store.
func BenchmarkRelay(b *testing.B) {
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
			st := stacktest.Start(b, stacktest.Options{NoAgent: true, Relay: func(c *relay.Config) {
				c.RateLimit, c.RateBurst, c.MaxInFlight = 1e9, 1e9, 1e5
			}})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			connected := make(chan struct{})
			var once sync.Once
			c, err := tunnel.NewClient(tunnel.Config{RelayURL: st.RelayURL, Token: st.Token,
				Handler: instantAgent{reply: []byte(`{"received":true}`)},
				OnState: func(cs tunnel.ConnState) {
					if cs.State == tunnel.StateConnected {
						once.Do(func() { close(connected) })
					}
				}})
			if err != nil {
				b.Fatal(err)
			}
			done := make(chan struct{})
			go func() { c.Run(ctx); close(done) }()
			defer func() { cancel(); <-done }()
			<-connected
			body := bytes.Repeat([]byte("x"), bc.size)
			client := &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 64}}
			do := func() error {
				resp, err := client.Post(st.TunnelURL+"/voice", "application/json", bytes.NewReader(body))
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
			b.SetBytes(int64(bc.size))
			b.ReportAllocs()
			b.ResetTimer()
			if bc.conns == 1 {
				for b.Loop() {
					if err := do(); err != nil {
						b.Fatal(err)
					}
				}
			} else {
				b.SetParallelism(max(1, bc.conns/runtimeProcs()))
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if err := do(); err != nil {
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
