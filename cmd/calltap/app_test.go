package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/calltap/calltap/relay/polltest"
	"github.com/calltap/calltap/storage"
	"github.com/calltap/calltap/storage/agentdb"
)

var tunnelLine = regexp.MustCompile(`Tunnel +(\S+)`)

// tunnelURL waits for a command's banner and returns its tunnel URL.
func tunnelURL(t *testing.T, p *proc) string {
	t.Helper()
	var url string
	polltest.Until(t, 20*time.Second, func() bool {
		if m := tunnelLine.FindStringSubmatch(p.out.String()); m != nil {
			url = m[1]
			return true
		}
		return false
	}, "the tunnel did not come up")
	return url
}

// exitWithin waits for p to exit and returns its exit status; it fails the
// test if p is still running after d.
func exitWithin(t *testing.T, p *proc, d time.Duration, what string) int {
	t.Helper()
	exited := make(chan error, 1)
	go func() { exited <- p.cmd.Wait() }()
	select {
	case err := <-exited:
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode()
		}
		return 0
	case <-time.After(d):
		t.Fatalf("%s: still running %s later", what, d)
		return -1
	}
}

// Revoking the dev token from another terminal ends `calltap dev` with one
// line saying why and exit status 1 (within a second; the test allows 30 s
// on a busy machine).
func TestRevokingDevTokenEndsDev(t *testing.T) {
	h := httptest.NewServer(&counter{})
	defer h.Close()
	dir := t.TempDir()
	dev := start(t, "dev", "--forward-to", h.URL, "--listen", freeAddr(t), "--inspect", "127.0.0.1:0", "--data", dir)
	url := tunnelURL(t, dev)
	if code := postStatus(url, `{"n":1}`); code != http.StatusOK {
		t.Fatalf("a request through the tunnel: %d", code)
	}
	if code, _, stderr := runCmd(t, "relay", "token", "revoke", "dev", "--data", dir); code != 0 {
		t.Fatalf("token revoke: %d %s", code, stderr)
	}
	if code := exitWithin(t, dev, 30*time.Second, "calltap dev after its token was revoked"); code != 1 {
		t.Errorf("exit status %d, want 1", code)
	}
	out := dev.out.String()
	if !strings.Contains(out, "calltap dev: ") || !strings.Contains(out, "revoked") {
		t.Errorf("dev's last words do not say the token was revoked:\n%s", out)
	}
}

// SIGINT while requests stream in ends dev, and listen with its relay,
// within their grace period; every request that got 2xx or 202 is
// afterwards in the agent's store or, answered 202 once the agent had gone,
// in the relay's queue.
func TestInterruptDuringStreamLosesNothing(t *testing.T) {
	for _, mode := range []string{"dev", "listen"} {
		t.Run(mode, func(t *testing.T) {
			h := httptest.NewServer(&counter{})
			defer h.Close()
			dir := t.TempDir()
			agentData := dir
			var procs []*proc
			var url string
			if mode == "dev" {
				dev := start(t, "dev", "--forward-to", h.URL, "--listen", freeAddr(t), "--inspect", "", "--data", dir, "--quiet")
				procs = append(procs, dev)
				url = tunnelURL(t, dev)
			} else {
				relayAddr := freeAddr(t)
				relayURL := "http://" + relayAddr
				procs = append(procs, start(t, "relay", "--listen", relayAddr, "--insecure-http", "--public-url", relayURL, "--data", dir))
				code, stdout, stderr := runCmd(t, "relay", "token", "create", "alice", "--data", dir, "--public-url", relayURL)
				if code != 0 {
					t.Fatalf("token create: %s", stderr)
				}
				token := regexp.MustCompile(`ct_\S+`).FindString(stdout)
				agentData = t.TempDir()
				listen := start(t, "listen", "--relay", relayURL, "--token", token, "--forward-to", h.URL, "--inspect", "", "--data", agentData, "--quiet")
				procs = append(procs, listen)
				url = tunnelURL(t, listen)
			}

			// Four senders stream requests until the commands are gone.
			var (
				mu       sync.Mutex
				accepted []string
				wg       sync.WaitGroup
				stop     = make(chan struct{})
			)
			for s := range 4 {
				wg.Go(func() {
					for n := 0; ; n++ {
						select {
						case <-stop:
							return
						default:
						}
						body := fmt.Sprintf(`{"sender":%d,"n":%d}`, s, n)
						code := postStatus(url, body)
						if code >= 200 && code < 300 {
							mu.Lock()
							accepted = append(accepted, body)
							mu.Unlock()
						}
						if code == 0 {
							return // the relay is gone
						}
					}
				})
			}
			polltest.Until(t, 10*time.Second, func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(accepted) >= 50
			}, "the stream did not start")
			for _, p := range procs {
				p.cmd.Process.Signal(syscall.SIGINT)
			}
			for _, p := range procs {
				if code := exitWithin(t, p, httpGrace+time.Minute, mode+" after SIGINT"); code != 0 {
					t.Errorf("exit status %d after SIGINT, want 0", code)
				}
			}
			close(stop)
			wg.Wait()

			db, err := agentDB(context.Background(), agentData)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			saved := map[string]bool{}
			for offset := 0; ; offset += 200 {
				caps, _, err := db.Captures(context.Background(), agentdb.CaptureFilter{Page: storage.Page{Limit: 200, Offset: offset}})
				if err != nil {
					t.Fatal(err)
				}
				for _, c := range caps {
					full, err := db.Capture(context.Background(), c.ID)
					if err != nil {
						t.Fatal(err)
					}
					saved[string(full.Body)] = true
				}
				if len(caps) < 200 {
					break
				}
			}
			// What the relay answered 202 for after the agent had gone waits
			// in the relay's queue for the agent's next start.
			for _, q := range queued(t, dir) {
				saved[string(q.Body)] = true
			}
			for _, b := range accepted {
				if !saved[b] {
					t.Errorf("%s was answered 2xx or 202 but is neither in the agent's store nor in the relay's queue", b)
				}
			}
		})
	}
}

// SIGINT while calls are being dispatched ends mock-service within its
// grace period; every call it accepted is in its log when it starts again.
func TestInterruptMockServiceLosesNothing(t *testing.T) {
	h := httptest.NewServer(&counter{})
	defer h.Close()
	dir, addr := t.TempDir(), freeAddr(t)
	args := []string{"mock-service", "--listen", addr, "--api-key", "test_key=webhooks:read,webhooks:write", "--allow-http-webhooks",
		"--time-scale", "0.001", "--data", dir, "--quiet"}
	svc := start(t, args...)
	base := "http://" + addr + "/api/v1/ext"
	call := func(method, path, body string) (int, []byte) {
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer test_key")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, nil
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	polltest.Until(t, 15*time.Second, func() bool { code, _ := call("GET", "/webhooks/", ""); return code == http.StatusOK }, "mock-service did not come up")

	var (
		mu       sync.Mutex
		accepted []string
		wg       sync.WaitGroup
		stop     = make(chan struct{})
	)
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				code, b := call("POST", "/calls/dispatch/", `{"to_number":"+14155550123","event_webhook_url":"`+h.URL+`/hook"}`)
				if code == 0 {
					return // the service is gone
				}
				var out struct {
					Data struct {
						CallID string `json:"call_id"`
					} `json:"data"`
				}
				if code >= 200 && code < 300 && json.Unmarshal(b, &out) == nil && out.Data.CallID != "" {
					mu.Lock()
					accepted = append(accepted, out.Data.CallID)
					mu.Unlock()
				}
			}
		})
	}
	polltest.Until(t, 10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(accepted) >= 20
	}, "no calls were dispatched")
	svc.cmd.Process.Signal(syscall.SIGINT)
	if code := exitWithin(t, svc, httpGrace+time.Minute, "mock-service after SIGINT"); code != 0 {
		t.Errorf("exit status %d after SIGINT, want 0", code)
	}
	close(stop)
	wg.Wait()

	start(t, args...)
	polltest.Until(t, 15*time.Second, func() bool { code, _ := call("GET", "/webhooks/", ""); return code == http.StatusOK }, "mock-service did not come back")
	for _, id := range accepted {
		code, b := call("GET", "/webhooks/?call_id="+id, "")
		var page struct {
			Data struct {
				Count int `json:"count"`
			} `json:"data"`
		}
		if code != http.StatusOK || json.Unmarshal(b, &page) != nil || page.Data.Count == 0 {
			t.Errorf("call %s was accepted before SIGINT but has no delivery after the restart: %d %s", id, code, b)
		}
	}
}
