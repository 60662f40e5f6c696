package main

import (
	"fmt"
	"net/http/httptest"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/calltap/calltap/relay/cluster/natstest"
	"github.com/calltap/calltap/relay/polltest"
)

// TestClaimsAcrossTeamNodes: a team relay of three nodes; alice's agent on
// n0, bob's on n1, the default's on n2; each event of a call lands on the
// next node, as DNS round robin would send it. Every event reaches the
// claimant of its call's first event, through the node holding its agent.
// Then n0, alice's node, is killed (SIGKILL) while a call of hers is in
// progress: the call's later events, sent to the live nodes and retried as
// the service retries, still reach her handler, in order, once her agent
// is on a live node; nobody else gets any of them.
func TestClaimsAcrossTeamNodes(t *testing.T) {
	nats := natstest.Start(t, 3)
	nodes, urls := startNodes(t, nats)
	tok, id := clusterToken(t, nats, "team")
	devs := map[string]*developer{}
	for i, name := range []string{"alice", "bob", ""} {
		d := &developer{name: name, dir: t.TempDir(), h: &counter{}}
		hs := httptest.NewServer(d.h)
		t.Cleanup(hs.Close)
		// Each agent reaches its own node first, and knows the others.
		relays := strings.Join(append(slices.Clone(urls[i:]), urls[:i]...), ",")
		args := []string{"listen", "--relay", relays, "--token", tok, "--forward-to", hs.URL, "--inspect", "", "--data", d.dir}
		if name != "" {
			args = append(args, "--claim", "call.variables.developer="+name)
		}
		d.agent = start(t, args...)
		tunnelURL(t, d.agent)
		devs[name] = d
	}
	// Every node knows both claimants before the calls start.
	for _, u := range urls {
		polltest.Until(t, 20*time.Second, func() bool {
			m := getBody(u + "/metrics")
			return strings.Contains(m, "call.variables.developer=alice") && strings.Contains(m, "call.variables.developer=bob")
		}, u+" did not learn of the claimants")
	}
	s := &senders{urls: urls, path: "/t/" + id}
	want := map[string][]string{}
	call := func(who string, n int, nodeOf func(i int) string) {
		c := fmt.Sprintf("%s-%d", who, n)
		for i := range claimedEventKinds {
			eid, body := claimedEvent(c, who, i)
			s.deliver(t, nodeOf(i), eid, body)
			want[who] = append(want[who], eid)
		}
	}
	roundRobin := func(i int) string { return urls[i%len(urls)] }
	for n := range 4 {
		for _, who := range []string{"alice", "bob", "carol"} {
			call(who, n, roundRobin)
		}
	}
	// A call of alice's in progress when her node dies.
	eid, body := claimedEvent("alice-9", "alice", 0)
	s.deliver(t, urls[1], eid, body)
	want["alice"] = append(want["alice"], eid)
	polltest.Until(t, 10*time.Second, func() bool { return slices.Contains(devs["alice"].got(), eid) }, "alice-9's first event did not reach her")
	nodes[0].cmd.Process.Signal(syscall.SIGKILL)
	nodes[0].cmd.Wait()
	live := urls[1:]
	s.urls = live
	for i := 1; i < len(claimedEventKinds); i++ {
		eid, body := claimedEvent("alice-9", "alice", i)
		s.deliver(t, live[i%2], eid, body)
		want["alice"] = append(want["alice"], eid)
	}
	for _, who := range []string{"alice", "bob", "carol"} {
		call(who, 10, func(i int) string { return live[i%2] })
	}
	for name, who := range map[string]string{"alice": "alice", "bob": "bob", "": "carol"} {
		d := devs[name]
		polltest.Until(t, 60*time.Second, func() bool { return len(dedupe(d.got())) >= len(want[who]) }, who+"'s events did not all reach their agent")
		// A sender told its outcome was unknown sends again: a repeat is
		// the service's to send, and the agent marks it; each first copy
		// comes in its call's order.
		if got := dedupe(d.got()); !slices.Equal(got, want[who]) {
			t.Errorf("%s's handler got %v, want %v", who, got, want[who])
		}
	}
}

// dedupe keeps the first copy of each id, in order.
func dedupe(ids []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, id := range ids {
		if !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out
}
