package main

import (
	"net/http/httptest"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Ctrl-C on `calltap dev` is an orderly stop, and its log reads as one:
// no error of a connection closed under a reader.
func TestDevCtrlCLogsNoFault(t *testing.T) {
	h := httptest.NewServer(&counter{})
	defer h.Close()
	dev := start(t, "dev", "--forward-to", h.URL, "--listen", freeAddr(t), "--inspect", "127.0.0.1:0", "--data", filepath.Join(t.TempDir(), "data")) // made 0700 by dev: no warning
	url := tunnelURL(t, dev)
	if code := postStatus(url, `{"n":1}`); code != 200 {
		t.Fatalf("a request through the tunnel: %d", code)
	}
	dev.cmd.Process.Signal(syscall.SIGINT)
	if code := exitWithin(t, dev, httpGrace+time.Minute, "dev after SIGINT"); code != 0 {
		t.Errorf("exit status %d after SIGINT, want 0", code)
	}
	out := dev.out.String()
	for _, fault := range []string{"use of closed network connection", "level=WARN", "level=ERROR"} {
		if strings.Contains(out, fault) {
			t.Errorf("the log of an orderly stop has %q:\n%s", fault, out)
		}
	}
}
