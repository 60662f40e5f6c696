package main

import (
	"net"
	"strings"
	"testing"
)

// replay --expect against a handler that is down says what failed.
func TestReplayNamesWhyThereWasNoAnswer(t *testing.T) {
	src, cs := exportStore(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "http://" + ln.Addr().String()
	ln.Close()
	code, stdout, stderr := runCmd(t, "replay", "--call", cs[0].CallID, "--data", src, "--to", down, "--time-scale", "0", "--expect", "2xx")
	if code != 1 || !strings.Contains(stdout, "got no answer (connection refused") {
		t.Errorf("replay against a handler that is down: %d\n%s%s", code, stdout, stderr)
	}
}
