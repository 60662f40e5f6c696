package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/calltap/calltap/relay/polltest"
)

// load sends n requests, c at a time, and counts the answers by status.
func load(t *testing.T, url string, n, c int) map[int]int {
	t.Helper()
	var next atomic.Int32
	var mu sync.Mutex
	counts := map[int]int{}
	var wg sync.WaitGroup
	for range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for int(next.Add(1)) <= n {
				status := postStatus(url, "{}")
				mu.Lock()
				counts[status]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return counts
}

// More requests than the default burst (200) in far less time than the
// default rate (50/s) allows: dev by default and a relay with
// --rate-limit 0 answer them all.
func TestRateLimitZeroMeansNone(t *testing.T) {
	h := httptest.NewServer(&counter{})
	defer h.Close()
	const n = 600

	dev := start(t, "dev", "--forward-to", h.URL, "--listen", freeAddr(t), "--inspect", "", "--data", t.TempDir())
	if counts := load(t, tunnelURL(t, dev), n, 8); counts[http.StatusOK] != n {
		t.Errorf("dev without --rate-limit answered %v, want %d × 200", counts, n)
	}

	dir := t.TempDir()
	relayAddr := freeAddr(t)
	relayURL := "http://" + relayAddr
	start(t, "relay", "--listen", relayAddr, "--insecure-http", "--public-url", relayURL, "--data", dir, "--rate-limit", "0")
	code, stdout, stderr := runCmd(t, "relay", "token", "create", "alice", "--data", dir, "--public-url", relayURL, "--json")
	if code != 0 {
		t.Fatalf("token create: %s", stderr)
	}
	var tok struct {
		Token string `json:"token"`
		URL   string `json:"url"`
	}
	json.Unmarshal([]byte(stdout), &tok)
	start(t, "listen", "--relay", relayURL, "--token", tok.Token, "--forward-to", h.URL, "--inspect", "", "--data", t.TempDir())
	polltest.Until(t, 15*time.Second, func() bool { return postStatus(tok.URL, "{}") == http.StatusOK }, "the tunnel did not come up")
	if counts := load(t, tok.URL, n, 8); counts[http.StatusOK] != n {
		t.Errorf("relay --rate-limit 0 answered %v, want %d × 200", counts, n)
	}
}

// A negative or non-numeric rate is a usage error of the process: one line, exit 2.
func TestNegativeRateLimitIsAUsageError(t *testing.T) {
	for _, args := range [][]string{
		{"dev", "--forward-to", "http://127.0.0.1:3000", "--rate-limit", "-1"},
		{"relay", "--insecure-http", "--listen", "127.0.0.1:0", "--rate-limit", "-1"},
		{"relay", "--insecure-http", "--listen", "127.0.0.1:0", "--rate-limit", "NaN"},
		{"relay", "--insecure-http", "--listen", "127.0.0.1:0", "--rate-burst", "-5"},
	} {
		args = append(args, "--data", t.TempDir())
		p := start(t, args...)
		code := exitWithin(t, p, 30*time.Second, strings.Join(args, " "))
		out := p.out.String()
		if code != 2 || strings.Count(strings.TrimRight(out, "\n"), "\n") != 0 || !strings.Contains(out, "--rate-") {
			t.Errorf("%v: exit %d, output %q; want one line about the rate and exit 2", args, code, out)
		}
	}
}
