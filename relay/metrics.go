package relay

import (
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
)

// metrics are the relay's Prometheus counters.
type metrics struct {
	agentsConnected atomic.Int64
	byClass         [6]atomic.Int64 // index status/100; 0 for anything odd
	bytesIn         atomic.Int64
	bytesOut        atomic.Int64
}

func (m *metrics) countStatus(code int) {
	c := code / 100
	if c < 1 || c > 5 {
		c = 0
	}
	m.byClass[c].Add(1)
}

func (s *Server) serveMetrics(w http.ResponseWriter) {
	var depth int
	var bytes int64
	for _, t := range s.snapshotTunnels() {
		t.mu.Lock()
		depth += t.queued
		bytes += t.queuedBytes
		t.mu.Unlock()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# HELP calltap_tunnels_connected Tunnels with an agent connected.\n# TYPE calltap_tunnels_connected gauge\ncalltap_tunnels_connected %d\n", s.metrics.agentsConnected.Load())
	fmt.Fprintf(&b, "# HELP calltap_requests_total Requests answered to senders, by status class.\n# TYPE calltap_requests_total counter\n")
	for c := 1; c <= 5; c++ {
		fmt.Fprintf(&b, "calltap_requests_total{class=\"%dxx\"} %d\n", c, s.metrics.byClass[c].Load())
	}
	fmt.Fprintf(&b, "# HELP calltap_queue_depth Requests held in offline queues.\n# TYPE calltap_queue_depth gauge\ncalltap_queue_depth %d\n", depth)
	fmt.Fprintf(&b, "# HELP calltap_queue_bytes Bytes held in offline queues.\n# TYPE calltap_queue_bytes gauge\ncalltap_queue_bytes %d\n", bytes)
	fmt.Fprintf(&b, "# HELP calltap_bytes_in_total Request body bytes received from senders.\n# TYPE calltap_bytes_in_total counter\ncalltap_bytes_in_total %d\n", s.metrics.bytesIn.Load())
	fmt.Fprintf(&b, "# HELP calltap_bytes_out_total Response body bytes sent to senders.\n# TYPE calltap_bytes_out_total counter\ncalltap_bytes_out_total %d\n", s.metrics.bytesOut.Load())
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	w.Write([]byte(b.String()))
}
