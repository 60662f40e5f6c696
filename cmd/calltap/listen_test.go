package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/calltap/calltap/cmd/stacktest"
	"github.com/calltap/calltap/inspector/agent"
	"github.com/calltap/calltap/relay"
	"github.com/calltap/calltap/relay/polltest"
)

func TestListenSummarisesRefusedSenders(t *testing.T) {
	h := httptest.NewServer(nil)
	defer h.Close()
	// The relay tells the agent often, so the summing up is the agent's.
	st := stacktest.Start(t, stacktest.Options{ForwardTo: h.URL, NoAgent: true, Relay: func(c *relay.Config) {
		c.RateLimit, c.RateBurst = 1e6, 1e6
		c.NoticeInterval = 5 * time.Millisecond
	}})
	var out, errb syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"listen", "--relay", st.RelayURL, "--token", st.Token, "--forward-to", h.URL,
			"--require-header", "X-Secret: s3cret", "--inspect", "127.0.0.1:0", "--data", t.TempDir()},
			Stdio{In: strings.NewReader(""), Out: &out, Err: &errb})
	}()
	inspectURL := regexp.MustCompile(`Inspector  (http://\S+)`)
	polltest.Until(t, 10*time.Second, func() bool { return inspectURL.MatchString(out.String()) }, "listen printed no banner")
	inspector := inspectURL.FindStringSubmatch(out.String())[1]
	if first, _, _ := strings.Cut(out.String(), "\n"); !strings.HasPrefix(first, "calltap listen · ") {
		t.Errorf("listen's banner begins %q, want its own name (calltap listen · version)", first)
	}

	const n = 2000
	start := time.Now()
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < n/4; i++ {
				resp, err := http.Post(st.TunnelURL, "application/json", strings.NewReader("{}"))
				if err != nil {
					t.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusUnauthorized {
					t.Errorf("a sender without the header got %d, want 401", resp.StatusCode)
					return
				}
			}
		}()
	}
	wg.Wait()
	polltest.Until(t, 10*time.Second, func() bool {
		var env struct {
			Data struct {
				Rejected int64 `json:"rejected"`
			} `json:"data"`
		}
		resp, err := http.Get(inspector + "/api/v1/ext/tunnel/")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		return json.NewDecoder(resp.Body).Decode(&env) == nil && env.Data.Rejected == n
	}, "the agent did not hear of every refusal")
	elapsed := time.Since(start)
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("listen exited %d: %s", code, errb.String())
	}

	var lines, total int
	for _, l := range strings.Split(out.String(), "\n") {
		if !strings.Contains(l, "relay refused") {
			continue
		}
		lines++
		var k int
		if _, err := fmt.Sscanf(strings.TrimSpace(l), "relay refused %d request(s)", &k); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		total += k
	}
	// The first refusal at once, a summary per interval, the rest at exit.
	if most := 2 + int(elapsed/agent.RefusalReportEvery); lines > most {
		t.Errorf("%d refusals printed %d lines, want at most %d:\n%s", n, lines, most, out.String())
	}
	if total != n {
		t.Errorf("the lines add up to %d refusals, want %d:\n%s", total, n, out.String())
	}
}
