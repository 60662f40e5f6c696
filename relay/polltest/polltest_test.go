package polltest

import (
	"testing"
	"time"
)

func TestUntilReturnsOnceTheConditionHolds(t *testing.T) {
	n := 0
	Until(t, 5*time.Second, func() bool { n++; return n == 3 }, "three looks")
	if n != 3 {
		t.Errorf("cond was called %d times, want 3", n)
	}
}

// A test's short deadline is raised to MinWait: a condition that takes
// longer than the test said still passes, since a deadline bounds a hang.
func TestUntilWaitsAtLeastMinWait(t *testing.T) {
	start := time.Now()
	Until(t, 10*time.Millisecond, func() bool { return time.Since(start) > 300*time.Millisecond }, "slow condition")
}
