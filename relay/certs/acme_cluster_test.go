package certs_test

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/calltap/calltap/relay/certs"
	"github.com/calltap/calltap/relay/cluster"
	"github.com/calltap/calltap/relay/cluster/natstest"
)

// Three relay nodes share autocert's cache in JetStream: the node asked
// first obtains the certificate, the CA's TLS-ALPN-01 check is answered by
// another node from the shared cache, and the third serves the same
// certificate with the CA gone.
func TestACMEOneCertificateForEveryNode(t *testing.T) {
	nats := natstest.Start(t, 3)
	lns := []net.Listener{listenLoopback(t), listenLoopback(t), listenLoopback(t)}
	// Pebble validates on node 2's port only; node 0 is the one asking.
	p := startPebble(t, portOf(t, lns[2].Addr().String()), closedPort(t))
	for i, ln := range lns {
		c, err := cluster.Open(context.Background(), cluster.Options{URLs: nats.URLs(), Replicas: 3, Node: "n" + strconv.Itoa(i), Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		tl, err := certs.New(certs.Options{
			Domains:      []string{acmeDomain},
			SharedCache:  c.CertCache,
			DirectoryURL: p.DirectoryURL,
			CARootsFile:  p.RootsFile,
		})
		if err != nil {
			t.Fatal(err)
		}
		serveTLS(t, ln, tl.Config(), http.HandlerFunc(hello))
	}
	roots, root := p.issuerRoots()
	dial := func(i int) *tls.ConnectionState {
		t.Helper()
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 2 * time.Minute}, "tcp", lns[i].Addr().String(), &tls.Config{ServerName: acmeDomain, RootCAs: roots})
		if err != nil {
			t.Fatalf("handshake with node %d: %v", i, err)
		}
		defer conn.Close()
		cs := conn.ConnectionState()
		return &cs
	}
	first := dial(0)
	checkIssuedByPebble(t, *first, root)
	issued := first.PeerCertificates[0]

	p.wfe.Close() // from here on no node can reach the CA
	for _, i := range []int{1, 2} {
		if got := dial(i).PeerCertificates[0]; !got.Equal(issued) {
			t.Errorf("node %d served a certificate other than the one node 0 obtained", i)
		}
	}
}
