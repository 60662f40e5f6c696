package agent

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the run if any goroutine is left once the tests are over:
// the agent and the media saver wait for every goroutine they start.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
