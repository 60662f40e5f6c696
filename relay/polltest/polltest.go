// Package polltest waits in tests for a condition to hold, polling it until
// a deadline, so that no test sleeps a guessed time for something to be
// ready. It sits under relay, the lowest layer whose tests poll, and
// imports only the standard library, so that any test can use it without
// an import cycle.
package polltest

import (
	"testing"
	"time"
)

// interval is how long Until waits between two looks at the condition:
// short beside the deadlines tests give, long enough not to spin.
const interval = 10 * time.Millisecond

// MinWait is the least Until waits before it gives up. A deadline in a
// test bounds a hang; it never checks speed. On a machine whose two cores
// run other builds and tests, something that takes 50 ms alone can take
// many seconds, so the few seconds a test names are raised to this.
const MinWait = 2 * time.Minute

// Until calls cond until it reports true, and fails the test with msg when
// it has not within the given time (at least MinWait).
func Until(t testing.TB, within time.Duration, cond func() bool, msg string) {
	t.Helper()
	within = max(within, MinWait)
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", within, msg)
		}
		time.Sleep(interval)
	}
}
