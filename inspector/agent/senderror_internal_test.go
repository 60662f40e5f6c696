package agent

import (
	"context"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/calltap/calltap/relay/wire"
	"github.com/calltap/calltap/storage/agentdb"
)

// A try that got no answer says what failed, in words: refused, timed
// out, reset.
func TestSendFailureNamesItsCause(t *testing.T) {
	ctx := context.Background()
	db, err := agentdb.OpenAgent(ctx, filepath.Join(t.TempDir(), "agent.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	a, err := New(Config{Store: db, ForwardTimeout: 300 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}

	// Nothing listens: refused.
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refusedAddr := closed.Addr().String()
	closed.Close()

	// Reads the request, then resets the connection.
	resetter := listen(t, func(c *net.TCPConn) {
		c.Read(make([]byte, 4096))
		c.SetLinger(0)
		c.Close()
	})
	// Reads the request and never answers.
	silent := listen(t, func(c *net.TCPConn) {
		io.Copy(io.Discard, c)
	})

	for addr, want := range map[string]string{
		refusedAddr: "connection refused",
		resetter:    "connection reset",
		silent:      "timed out",
	} {
		c := a.newCapture(SourceReplay, "POST", "/x", nil, []byte("{}"))
		c.Target = "http://" + addr + "/x"
		res := a.send(ctx, c, nil, wire.Limits{}, nil)
		if !strings.HasPrefix(res.err, want) {
			t.Errorf("a try at %s: error %q, want it to start with %q", addr, res.err, want)
		}
	}
}

// listen serves each connection with serve until the test ends.
func listen(t *testing.T, serve func(*net.TCPConn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				serve(c.(*net.TCPConn))
			}()
		}
	}()
	return ln.Addr().String()
}
