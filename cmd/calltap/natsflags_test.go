package main

import (
	"strings"
	"testing"

	"github.com/calltap/calltap/relay/cluster/natstest"
)

// With --nats, what a relay cannot keep is refused in one line: a byte
// limit per tunnel (the stream counts requests), and the default three
// replicas on a NATS cluster of fewer servers, from the relay and from
// `token create` alike, never a silent single copy.
func TestNATSFlagsRefuseWhatTheyCannotKeep(t *testing.T) {
	nats := natstest.Start(t, 1)
	oneLine := func(what string, code, want int, stderr, mention string) {
		t.Helper()
		t.Logf("%s: exit %d: %s", what, code, strings.TrimSpace(stderr))
		if code != want || strings.Count(strings.TrimSpace(stderr), "\n") != 0 || !strings.Contains(stderr, mention) {
			t.Errorf("%s: exit %d, stderr %q; want exit %d and one line naming %s", what, code, stderr, want, mention)
		}
	}
	code, _, stderr := runCmd(t, "relay", "--nats", nats.URLs(), "--queue-max-bytes", "1000", "--insecure-http", "--listen", freeAddr(t), "--data", t.TempDir())
	oneLine("relay --nats --queue-max-bytes", code, 2, stderr, "--queue-max-bytes")
	code, _, stderr = runCmd(t, "relay", "--nats", nats.URLs(), "--insecure-http", "--listen", freeAddr(t), "--data", t.TempDir())
	oneLine("relay --nats on one NATS server", code, 1, stderr, "--nats-replicas")
	code, _, stderr = runCmd(t, "relay", "token", "create", "alice", "--nats", nats.URLs())
	oneLine("token create --nats on one NATS server", code, 1, stderr, "--nats-replicas")
	if code, stdout, stderr := runCmd(t, "relay", "token", "create", "alice", "--nats", nats.URLs(), "--nats-replicas", "1"); code != 0 || !strings.Contains(stdout, "ct_") {
		t.Errorf("token create --nats --nats-replicas 1 on one NATS server: exit %d %q %q", code, stdout, stderr)
	}
}
