package cluster_test

import (
	"context"
	"io"
	"log"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/calltap/calltap/relay/cluster/natstest"
	"github.com/calltap/calltap/relay/polltest"
	"github.com/letsencrypt/challtestsrv"
)

// relayName is the relay's one name in TestOneNameSeveralNodes; the test's
// DNS server gives it two addresses, one per node.
const relayName = "relay.calltap.test"

// dnsResolver runs a DNS server (pebble-challtestsrv, in this process) that
// answers relayName with addrs, and returns a resolver that asks only it.
func dnsResolver(t *testing.T, addrs ...string) *net.Resolver {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dnsAddr := ln.Addr().String()
	ln.Close() // challtestsrv takes an address, not a listener
	srv, err := challtestsrv.New(challtestsrv.Config{DNSAddrs: []string{dnsAddr}, Log: log.New(io.Discard, "", 0)})
	if err != nil {
		t.Fatal(err)
	}
	srv.SetDefaultDNSIPv4("")
	srv.SetDefaultDNSIPv6("")
	srv.AddDNSARecord(relayName, addrs)
	srv.Run()
	t.Cleanup(srv.Shutdown)
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", dnsAddr)
	}}
	polltest.Until(t, 10*time.Second, func() bool {
		got, err := r.LookupHost(context.Background(), relayName)
		return err == nil && len(got) == len(addrs)
	}, "the test DNS server did not answer")
	return r
}

// An agent given one name with two addresses, one node behind each,
// reaches the other node when the one it was on stops.
func TestOneNameSeveralNodes(t *testing.T) {
	nats := natstest.Start(t, 3)
	first := startNode(t, nats, "n0", nil)
	_, port, _ := net.SplitHostPort(first.URL[len("http://"):])
	second := startNodeAt(t, nats, "n1", "127.0.0.2:"+port, nil) // all of 127/8 is loopback on Linux
	resolver := dnsResolver(t, "127.0.0.1", "127.0.0.2")
	info := token(t, first, "alice")
	h, ts := startHandler(t, nil)
	startAgentAt(t, t.TempDir(), info.Token, ts.URL, "http://"+net.JoinHostPort(relayName, port), resolver)
	waitHeld(t, info, first, second)

	for _, n := range []*node{first, second} {
		if resp, body := post(t, tunnelURL(n, info), `{"n":"`+n.name+`"}`); resp.StatusCode != http.StatusNoContent {
			t.Fatalf("via %s: %d %s", n.name, resp.StatusCode, body)
		}
	}
	holder := first
	if !strings.Contains(metrics(t, first), "\ncalltap_tunnels_connected 1\n") {
		holder = second
	}
	other := map[*node]*node{first: second, second: first}[holder]
	holder.stop()
	polltest.Until(t, 15*time.Second, func() bool {
		return strings.Contains(metrics(t, other), "\ncalltap_tunnels_connected 1\n")
	}, "the agent did not reach "+other.name+" through the same name")
	if resp, body := post(t, tunnelURL(other, info), `{"n":"after"}`); resp.StatusCode != http.StatusNoContent {
		t.Errorf("via %s after %s stopped: %d %s", other.name, holder.name, resp.StatusCode, body)
	}
	if got := h.seen(); len(got) != 3 || got[2] != `{"n":"after"}` {
		t.Errorf("the handler saw %q", got)
	}
}
