package relay

import (
	"sync/atomic"
)

// metrics are the relay's Prometheus counters.
type metrics struct {
	agentsConnected atomic.Int64
	byClass         [6]atomic.Int64 // index status/100; 0 for anything odd
	bytesIn         atomic.Int64
	bytesOut        atomic.Int64
	crossIn         atomic.Int64 // requests other nodes handed to this one
	crossOut        atomic.Int64 // requests this node handed to others
	agentsFrozen    atomic.Int64 // agents taken for frozen (frozen.go)
}

// countStatus counts an answer of status code by its class.
func (m *metrics) countStatus(code int) {
	c := code / 100
	if c < 1 || c > 5 {
		c = 0
	}
	m.byClass[c].Add(1)
}
