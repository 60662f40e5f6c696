package main

import (
	"context"
	"net/http/httptest"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/calltap/calltap/relay/polltest"
	"github.com/calltap/calltap/storage/relaydb"
)

// A relay that lost its record of what an agent took (its disk filled, it
// restarted) sends those requests again. The agent saves none twice and
// forwards none twice, and its startup line does not promise them to the
// handler: the line once read "Delivering 3 requests" and none were.
func TestRelayResendingSavedRequestsIsNotAnnouncedAsDelivery(t *testing.T) {
	h := httptest.NewServer(&counter{})
	handler := h.Config.Handler.(*counter)
	defer h.Close()
	relayDir, agentDir := t.TempDir(), t.TempDir()
	relayAddr := freeAddr(t)
	relayURL := "http://" + relayAddr
	startRelay := func() *proc {
		return start(t, "relay", "--listen", relayAddr, "--insecure-http", "--public-url", relayURL, "--data", relayDir)
	}
	relay := startRelay()
	code, stdout, stderr := runCmd(t, "relay", "token", "create", "alice", "--data", relayDir, "--public-url", relayURL)
	if code != 0 {
		t.Fatalf("token create: %s", stderr)
	}
	token := regexp.MustCompile(`ct_\S+`).FindString(stdout)
	listen := func() *proc {
		return start(t, "listen", "--relay", relayURL, "--token", token, "--forward-to", h.URL, "--inspect", "", "--data", agentDir)
	}
	stop := func(p *proc, what string) {
		t.Helper()
		p.cmd.Process.Signal(syscall.SIGINT)
		if code := exitWithin(t, p, httpGrace+time.Minute, what); code != 0 {
			t.Fatalf("%s: exit status %d after SIGINT", what, code)
		}
	}

	// Three requests wait in the relay's queue while the agent is away.
	agent := listen()
	url := tunnelURL(t, agent)
	stop(agent, "first listen")
	for _, b := range []string{`{"n":1}`, `{"n":2}`, `{"n":3}`} {
		if code := postStatus(url, b); code != 202 {
			t.Fatalf("post %s while away: %d, want 202", b, code)
		}
	}
	held := queued(t, relayDir)
	if len(held) != 3 {
		t.Fatalf("the relay holds %d requests, want 3", len(held))
	}

	// The agent takes them, and the handler gets each once.
	agent = listen()
	polltest.Until(t, 30*time.Second, func() bool { return len(handler.get()) == 3 }, "the held requests did not reach the handler")
	polltest.Until(t, 30*time.Second, func() bool { return len(queued(t, relayDir)) == 0 }, "the relay kept what the agent took")
	stop(agent, "second listen")
	stop(relay, "relay")

	// The relay forgets it handed them over, and sends them again.
	rdb, err := relayDB(context.Background(), relayDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range held {
		if err := rdb.Enqueue(context.Background(), q); err != nil {
			t.Fatal(err)
		}
	}
	rdb.Close()
	relay = startRelay()
	agent = listen()
	tunnelURL(t, agent)
	polltest.Until(t, 30*time.Second, func() bool { return len(queued(t, relayDir)) == 0 }, "the resent requests were not taken")

	if n := len(handler.get()); n != 3 {
		t.Errorf("the handler got %d requests, want 3: a resent one was forwarded again", n)
	}
	out := agent.out.String()
	if !strings.Contains(out, "held 3 requests") {
		t.Errorf("the startup line does not say what the relay held:\n%s", out)
	}
	if strings.Contains(out, "Delivering") {
		t.Errorf("the startup line promises the resent requests to the handler:\n%s", out)
	}
	stop(agent, "third listen")
	stop(relay, "relay again")
}

// queued reads every request the relay in dir holds, in every tunnel.
func queued(t *testing.T, dir string) []*relaydb.QueuedRequest {
	t.Helper()
	rdb, err := relayDB(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	stats, err := rdb.QueueStatsByTunnel(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var all []*relaydb.QueuedRequest
	for tunnel := range stats {
		qs, err := rdb.QueuedAfter(context.Background(), tunnel, 0, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, qs...)
	}
	return all
}
