package inspector_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the run if any goroutine is left once the tests are over:
// the agent, the media saver and the inspector's server leave none behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
