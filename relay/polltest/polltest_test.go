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
