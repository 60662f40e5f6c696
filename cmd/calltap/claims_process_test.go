package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/calltap/calltap/relay/polltest"
	"github.com/calltap/calltap/storage/agentdb"
)

// These tests run claims end to end, as a team would: one relay, one
// token, an agent per developer (calltap listen --claim) and one with no
// claim, each with its own handler and data directory.

// claimsRig is a relay process that can be restarted, and its token.
type claimsRig struct {
	t         *testing.T
	relayArgs []string
	relay     *proc
	relayURL  string
	token     string
	tunnelURL string
}

func newClaimsRig(t *testing.T) *claimsRig {
	dir, addr := t.TempDir(), freeAddr(t)
	r := &claimsRig{t: t, relayURL: "http://" + addr}
	r.relayArgs = []string{"relay", "--listen", addr, "--insecure-http", "--public-url", r.relayURL, "--data", dir,
		"--rate-limit", "10000", "--rate-burst", "10000"}
	r.relay = start(t, r.relayArgs...)
	code, stdout, stderr := runCmd(t, "relay", "token", "create", "team", "--data", dir, "--public-url", r.relayURL, "--json")
	if code != 0 {
		t.Fatalf("token create: %s", stderr)
	}
	var tok struct {
		Token string `json:"token"`
		URL   string `json:"url"`
	}
	if err := json.Unmarshal([]byte(stdout), &tok); err != nil {
		t.Fatal(err)
	}
	r.token, r.tunnelURL = tok.Token, tok.URL
	return r
}

// restartRelay stops the relay with sig and starts it again on the same
// address and data directory.
func (r *claimsRig) restartRelay(sig syscall.Signal) {
	r.t.Helper()
	r.relay.cmd.Process.Signal(sig)
	if code := exitWithin(r.t, r.relay, time.Minute, "relay"); sig == syscall.SIGTERM && code != 0 {
		r.t.Fatalf("relay: exit status %d after SIGTERM", code)
	}
	r.relay = start(r.t, r.relayArgs...)
	polltest.Until(r.t, 20*time.Second, func() bool {
		resp, err := http.Get(r.relayURL + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	}, "the relay did not come back")
}

// developer is an agent with its own handler and store; name "" is the
// team's default agent.
type developer struct {
	name  string
	dir   string
	h     *counter
	hurl  string
	agent *proc
}

func (r *claimsRig) developer(name string) *developer {
	d := &developer{name: name, dir: r.t.TempDir(), h: &counter{}}
	hs := httptest.NewServer(d.h)
	r.t.Cleanup(hs.Close)
	d.hurl = hs.URL
	r.listen(d)
	return d
}

// listen starts d's agent, claiming calls by call.variables.developer
// unless d is the default.
func (r *claimsRig) listen(d *developer) {
	r.t.Helper()
	args := []string{"listen", "--relay", r.relayURL, "--token", r.token, "--forward-to", d.hurl, "--inspect", "", "--data", d.dir}
	if d.name != "" {
		args = append(args, "--claim", "call.variables.developer="+d.name)
	}
	d.agent = start(r.t, args...)
	tunnelURL(r.t, d.agent)
}

// stop stops d's agent as Ctrl-C does.
func (d *developer) stop(t *testing.T) {
	t.Helper()
	d.agent.cmd.Process.Signal(syscall.SIGINT)
	if code := exitWithin(t, d.agent, httpGrace+time.Minute, "listen"); code != 0 {
		t.Fatalf("listen: exit status %d after SIGINT", code)
	}
}

// got lists the delivery ids d's handler received, in order.
func (d *developer) got() []string {
	var ids []string
	for _, b := range d.h.get() {
		var ev struct{ ID string }
		json.Unmarshal([]byte(b), &ev)
		ids = append(ids, ev.ID)
	}
	return ids
}

var claimedEventKinds = []string{"call.started", "call.connected", "call.ended", "call.analysis_completed"}

// callEvent is event i of call. Its first event names who placed it
// (call.variables.developer); of the later ones, the third names someone
// else, and the others nobody: they must follow the first all the same.
func claimedEvent(call, who string, i int) (id, body string) {
	var vars string
	switch i {
	case 0:
		vars = fmt.Sprintf(`,"variables":{"developer":%q}`, who)
	case 2:
		vars = `,"variables":{"developer":"bob"}`
	}
	id = fmt.Sprintf("%s.%d", call, i)
	return id, fmt.Sprintf(`{"id":%q,"event":%q,"call":{"call_id":%q%s}}`, id, claimedEventKinds[i], call, vars)
}

// sendCall sends every event of call, placed by who, in order, and
// returns their delivery ids; each answer must be want.
func sendCall(t *testing.T, url, call, who string, want int) []string {
	var ids []string
	for i := range claimedEventKinds {
		id, body := claimedEvent(call, who, i)
		if code := postStatus(url, body); code != want {
			t.Errorf("%s: answered %d, want %d", id, code, want)
		}
		ids = append(ids, id)
	}
	return ids
}

// storedIDs lists the delivery ids in a stopped agent's store.
func storedIDs(t *testing.T, dir string) []string {
	db, err := agentDB(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var ids []string
	var after int64
	for {
		cs, err := db.CapturesAfter(context.Background(), agentdb.CaptureFilter{}, after, 1000)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cs {
			ids = append(ids, c.DeliveryID)
			after = c.Seq
		}
		if len(cs) < 1000 {
			return ids
		}
	}
}

// soakFor is how long TestClaimsGiveEachDeveloperTheirCalls sends calls:
// CALLTAP_CLAIMS_SOAK (the ten minutes: CALLTAP_CLAIMS_SOAK=10m),
// or a short while in make test.
func soakFor(t *testing.T) time.Duration {
	v := os.Getenv("CALLTAP_CLAIMS_SOAK")
	if v == "" {
		return 10 * time.Second
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("CALLTAP_CLAIMS_SOAK: %v", err)
	}
	return d
}

// TestClaimsGiveEachDeveloperTheirCalls: alice and bob claim their calls
// by call.variables.developer, a third agent claims nothing; calls placed
// by alice, by bob and by carol (whom nobody claims) flow at once. Each
// handler gets exactly the calls of its agent's claim, every event of a
// call following its first, in order; the three agents stay connected
// throughout; and no agent's store holds another's calls.
func TestClaimsGiveEachDeveloperTheirCalls(t *testing.T) {
	r := newClaimsRig(t)
	alice, bob, team := r.developer("alice"), r.developer("bob"), r.developer("")
	soak := soakFor(t)
	var mu sync.Mutex
	sent := map[string][]string{}
	var wg sync.WaitGroup
	begin := time.Now()
	for _, who := range []string{"alice", "bob", "carol"} {
		wg.Go(func() {
			// A call every 20 ms from each: the pace of a busy test
			// account, not a flood, so that ten minutes stay checkable.
			pace := time.NewTicker(20 * time.Millisecond)
			defer pace.Stop()
			for n := 0; n < 3 || time.Since(begin) < soak; n++ {
				<-pace.C
				ids := sendCall(t, r.tunnelURL, fmt.Sprintf("%s-%d", who, n), who, http.StatusOK)
				mu.Lock()
				sent[who] = append(sent[who], ids...)
				mu.Unlock()
				if t.Failed() {
					return
				}
			}
		})
	}
	wg.Wait()
	for d, who := range map[*developer]string{alice: "alice", bob: "bob", team: "carol"} {
		if got := d.got(); !slices.Equal(got, sent[who]) {
			t.Errorf("%s's handler got %d events, want the %d of %s's calls in order; first difference at %d", who, len(got), len(sent[who]), who, firstDiff(got, sent[who]))
		}
	}
	out := r.relay.out.String()
	if n, m := strings.Count(out, "agent connected"), strings.Count(out, "agent disconnected"); n != 3 || m != 0 {
		t.Errorf("over %s of traffic the relay saw %d agent connections and %d disconnections, want 3 and 0", soak.Round(time.Second), n, m)
	}
	t.Logf("%d calls of 4 events over %s", (len(sent["alice"])+len(sent["bob"])+len(sent["carol"]))/4, time.Since(begin).Round(time.Second))
	for _, d := range []*developer{alice, bob, team} {
		d.stop(t)
	}
	for d, who := range map[*developer]string{alice: "alice", bob: "bob", team: "carol"} {
		for _, id := range storedIDs(t, d.dir) {
			if !strings.HasPrefix(id, who+"-") {
				t.Errorf("%s's store holds %s, of someone else's call", d.name, id)
			}
		}
	}
}

func firstDiff(a, b []string) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestAwayClaimantKeepsItsCalls: while alice's agent is stopped, her
// calls are answered 202 and go to nobody else, through a relay restart
// (SIGTERM, then SIGKILL); when she comes back they reach her handler, in
// order, once. Bob's calls flow meanwhile.
func TestAwayClaimantKeepsItsCalls(t *testing.T) {
	r := newClaimsRig(t)
	alice, bob, team := r.developer("alice"), r.developer("bob"), r.developer("")
	var want []string
	want = append(want, sendCall(t, r.tunnelURL, "alice-0", "alice", http.StatusOK)...)
	// A call in progress when she leaves: its first event reached her.
	_, first := claimedEvent("alice-1", "alice", 0)
	if code := postStatus(r.tunnelURL, first); code != http.StatusOK {
		t.Fatalf("alice-1's first event: %d", code)
	}
	want = append(want, "alice-1.0")
	alice.stop(t)
	for i := 1; i < len(claimedEventKinds); i++ {
		id, body := claimedEvent("alice-1", "alice", i)
		if code := postStatus(r.tunnelURL, body); code != http.StatusAccepted {
			t.Errorf("%s while alice is away: %d, want 202", id, code)
		}
		want = append(want, id)
	}
	want = append(want, sendCall(t, r.tunnelURL, "alice-2", "alice", http.StatusAccepted)...)
	bobWant := sendCall(t, r.tunnelURL, "bob-0", "bob", http.StatusOK)
	r.restartRelay(syscall.SIGTERM)
	want = append(want, sendCall(t, r.tunnelURL, "alice-3", "alice", http.StatusAccepted)...)
	r.restartRelay(syscall.SIGKILL)
	want = append(want, sendCall(t, r.tunnelURL, "alice-4", "alice", http.StatusAccepted)...)
	// Bob's agent may still be reconnecting: his event is his, live or
	// queued for him.
	_, bobs := claimedEvent("bob-1", "bob", 0)
	if code := postStatus(r.tunnelURL, bobs); code != http.StatusOK && code != http.StatusAccepted {
		t.Errorf("bob-1.0: %d", code)
	}
	bobWant = append(bobWant, "bob-1.0")
	polltest.Until(t, 30*time.Second, func() bool { return len(bob.got()) >= len(bobWant) }, "bob's event did not reach him")
	if got := team.got(); len(got) != 0 {
		t.Errorf("the default agent got %v", got)
	}
	r.listen(alice)
	polltest.Until(t, 30*time.Second, func() bool { return len(alice.got()) >= len(want) }, "alice's queued calls did not reach her")
	if got := alice.got(); !slices.Equal(got, want) {
		t.Errorf("alice's handler got %v, want %v", got, want)
	}
	if got := bob.got(); !slices.Equal(got, bobWant) {
		t.Errorf("bob's handler got %v, want %v", got, bobWant)
	}
}
