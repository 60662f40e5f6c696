package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/calltap/calltap/cmd/stacktest"
	"github.com/calltap/calltap/relay/polltest"
)

// Whitespace around a token is no part of it, at either end, from each of
// the three places listen takes it from.
func TestListenTrimsTheToken(t *testing.T) {
	h := httptest.NewServer(&counter{})
	defer h.Close()
	st := stacktest.Start(t, stacktest.Options{ForwardTo: h.URL, NoAgent: true})
	tokenFile := filepath.Join(t.TempDir(), "token")
	for _, tc := range []struct {
		name string
		args []string
		env  string
		file string
	}{
		{name: "--token with a leading space and tab", args: []string{"--token", " \t" + st.Token}},
		{name: "--token with a trailing newline", args: []string{"--token", st.Token + "\n"}},
		{name: "CALLTAP_TOKEN with spaces and CRLF", env: "  " + st.Token + " \r\n"},
		{name: "--token-file with a leading tab and CRLF", args: []string{"--token-file", tokenFile}, file: "\t" + st.Token + "\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("CALLTAP_TOKEN", tc.env)
			if tc.file != "" {
				if err := os.WriteFile(tokenFile, []byte(tc.file), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			var out, errb syncBuffer
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan int, 1)
			args := append([]string{"listen", "--relay", st.RelayURL, "--forward-to", h.URL, "--inspect", "", "--data", t.TempDir()}, tc.args...)
			go func() { done <- run(ctx, args, Stdio{In: strings.NewReader(""), Out: &out, Err: &errb}) }()
			polltest.Until(t, 20*time.Second, func() bool {
				select {
				case code := <-done:
					t.Fatalf("listen exited %d: %s", code, errb.String())
				default:
				}
				return postStatus(st.TunnelURL, "{}") == http.StatusOK
			}, "the agent did not connect")
			cancel()
			if code := <-done; code != 0 {
				t.Errorf("listen exit %d: %s", code, errb.String())
			}
		})
	}
	// Whitespace inside is no token: one line, exit 2.
	t.Setenv("CALLTAP_TOKEN", "")
	code, _, stderr := runCmd(t, "listen", "--relay", st.RelayURL, "--forward-to", h.URL, "--token", "ct_a b")
	if code != 2 || !strings.Contains(stderr, "whitespace") || strings.Count(strings.TrimRight(stderr, "\n"), "\n") != 0 {
		t.Errorf("a token with a space inside: exit %d, %q", code, stderr)
	}
}
