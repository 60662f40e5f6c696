// The relay's /metrics page: its counters and the state of its tunnels, in
// Prometheus's text format.

package relay

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
)

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
	fmt.Fprintf(&b, "# HELP calltap_agents_frozen_total Agents taken for frozen: connected, and silent for %s; their requests queued until they answered.\n# TYPE calltap_agents_frozen_total counter\ncalltap_agents_frozen_total %d\n", frozenAfter, s.metrics.agentsFrozen.Load())
	fmt.Fprintf(&b, "# HELP calltap_bytes_out_total Response body bytes sent to senders.\n# TYPE calltap_bytes_out_total counter\ncalltap_bytes_out_total %d\n", s.metrics.bytesOut.Load())
	s.claimMetrics(&b)
	if s.shared {
		s.clusterMetrics(&b)
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	w.Write([]byte(b.String()))
}

// clusterMetrics are a cluster node's own: calltap_tunnels_connected above
// counts the tunnels held here.
func (s *Server) clusterMetrics(b *strings.Builder) {
	fmt.Fprintf(b, "# HELP calltap_cluster_requests_total Requests handed between relay nodes: in, from another node to an agent here; out, to the node holding the agent.\n# TYPE calltap_cluster_requests_total counter\n")
	fmt.Fprintf(b, "calltap_cluster_requests_total{direction=\"in\"} %d\ncalltap_cluster_requests_total{direction=\"out\"} %d\n", s.metrics.crossIn.Load(), s.metrics.crossOut.Load())
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	st, err := s.cfg.Cluster.Stats(ctx)
	up := 1
	if err != nil {
		up = 0
	}
	fmt.Fprintf(b, "# HELP calltap_nats_up Whether this node reached NATS just now.\n# TYPE calltap_nats_up gauge\ncalltap_nats_up %d\n", up)
	// The depth is the stream's, the same on every node; while NATS is
	// away it is the last one seen.
	fmt.Fprintf(b, "# HELP calltap_cluster_queue_depth Requests in the shared queue, every tunnel's: how far agents lag behind.\n# TYPE calltap_cluster_queue_depth gauge\ncalltap_cluster_queue_depth %d\n", st.Queued)
	if err != nil {
		return
	}
	fmt.Fprintf(b, "# HELP calltap_nats_rtt_seconds Round trip to this node's NATS server.\n# TYPE calltap_nats_rtt_seconds gauge\ncalltap_nats_rtt_seconds %g\n", st.RTT.Seconds())
}

// claimMetrics are the seats of the tokens several agents share: each
// seat's deliveries (requests its agents saved) and the queue this node
// counts for it. A token without claimant seats has no lines here.
func (s *Server) claimMetrics(b *strings.Builder) {
	var delivered, depth []string
	for _, t := range s.snapshotTunnels() {
		if t.base != t || len(t.claimants()) == 0 {
			continue
		}
		for _, st := range append([]*tunnel{t}, t.claimants()...) {
			st.mu.Lock()
			queued := st.queued
			st.mu.Unlock()
			labels := fmt.Sprintf(`{token="%s",seat="%s",claims="%s"}`, labelValue(t.name), st.id, labelValue(strings.Join(st.claims.Strings(), " ")))
			delivered = append(delivered, fmt.Sprintf("calltap_claim_deliveries_total%s %d\n", labels, st.delivered.Load()))
			depth = append(depth, fmt.Sprintf("calltap_claim_queue_depth%s %d\n", labels, queued))
		}
	}
	if len(delivered) == 0 {
		return
	}
	slices.Sort(delivered)
	slices.Sort(depth)
	b.WriteString("# HELP calltap_claim_deliveries_total Requests the agents of a seat saved (claims=\"\" is the token's default seat).\n# TYPE calltap_claim_deliveries_total counter\n")
	b.WriteString(strings.Join(delivered, ""))
	b.WriteString("# HELP calltap_claim_queue_depth Requests queued for a seat whose agent is away, as this node counts them.\n# TYPE calltap_claim_queue_depth gauge\n")
	b.WriteString(strings.Join(depth, ""))
}

// labelEscapes are the only escapes of a label value in the text format:
// Go's %q would also write \u00a0 for a character it does not print, and a
// scraper would refuse the whole page.
var labelEscapes = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

// labelValue writes s as a label value of the text format, unquoted.
func labelValue(s string) string { return labelEscapes.Replace(s) }
