package main

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the run if any goroutine is left once the tests are over.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
