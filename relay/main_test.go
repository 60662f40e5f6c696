package relay_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the run if any goroutine is left once the tests are over:
// the relay's server, each agent connection's loops and the agent's client
// leave none behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
