package certs_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the run if any goroutine is left once the tests are over.
// Pebble, the ACME server the certificate tests run, is not ours: its
// validation workers and its challenge server's DNS listener have no way
// to be stopped, and are left out.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("github.com/letsencrypt/pebble/v2/va.VAImpl.processTasks"),
		goleak.IgnoreAnyFunction("github.com/miekg/dns.(*Server).serveTCP"),
		goleak.IgnoreAnyFunction("github.com/miekg/dns.(*Server).serveUDP"),
	)
}
