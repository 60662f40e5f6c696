package e2e_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the run if a stack leaves a goroutine behind: the relay,
// the agent, the media saver and the inspector's server each wait for the
// goroutines they start.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
