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

// Until calls cond until it reports true, and fails the test with msg when
// it has not within the given time.
func Until(t testing.TB, within time.Duration, cond func() bool, msg string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", within, msg)
		}
		time.Sleep(interval)
	}
}
