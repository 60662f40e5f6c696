package certs_test

// These tests get real certificates from Let's Encrypt's test CA, Pebble,
// run in this process: its web front end on a loopback HTTPS port, its
// validation authority resolving names through pebble-challtestsrv's DNS
// server and connecting to the relay's own listeners to check TLS-ALPN-01
// and HTTP-01 challenges. Validation is real (PEBBLE_VA_ALWAYS_VALID is
// never set); only the random delays are turned off.

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/calltap/calltap/inspector/agent"
	"github.com/calltap/calltap/relay"
	"github.com/calltap/calltap/relay/certs"
	"github.com/calltap/calltap/relay/tunnel"
	"github.com/calltap/calltap/storage"
	"github.com/calltap/calltap/storage/agentdb"
	"github.com/calltap/calltap/storage/relaydb"
	"github.com/letsencrypt/challtestsrv"
	pebbleca "github.com/letsencrypt/pebble/v2/ca"
	pebbledb "github.com/letsencrypt/pebble/v2/db"
	pebbleva "github.com/letsencrypt/pebble/v2/va"
	pebblewfe "github.com/letsencrypt/pebble/v2/wfe"
)

// acmeDomain is the relay's name in these tests; the test DNS server
// points it at 127.0.0.1.
const acmeDomain = "relay.calltap.test"

// syncBuffer collects logs written from any goroutine, including ones that
// outlive the test (Pebble's VA never stops).
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer // guarded by mu
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// The DNS server is process-wide: challtestsrv registers its handler with
// miekg/dns's global mux, and one server answers for every test.
var testDNS struct {
	once sync.Once
	srv  *challtestsrv.ChallSrv
	addr string
	err  error
}

// startTestDNS returns the address of a pebble-challtestsrv DNS server
// (TCP, which is what Pebble's VA uses) that resolves acmeDomain to
// 127.0.0.1 and nothing else.
func startTestDNS(t *testing.T) string {
	t.Helper()
	testDNS.once.Do(func() {
		// challtestsrv takes an address, not a listener: find a free port.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			testDNS.err = err
			return
		}
		addr := ln.Addr().String()
		ln.Close()
		srv, err := challtestsrv.New(challtestsrv.Config{DNSAddrs: []string{addr}, Log: log.New(io.Discard, "", 0)})
		if err != nil {
			testDNS.err = err
			return
		}
		// No answers by default (its default is 127.0.0.1 and ::1 for every
		// name): the VA dials the first address it gets, and the relay
		// listens on 127.0.0.1 only.
		srv.SetDefaultDNSIPv4("")
		srv.SetDefaultDNSIPv6("")
		srv.AddDNSARecord(acmeDomain, []string{"127.0.0.1"})
		srv.Run()
		r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		}}
		deadline := time.Now().Add(time.Minute)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			addrs, err := r.LookupHost(ctx, acmeDomain)
			cancel()
			if err == nil && len(addrs) == 1 && addrs[0] == "127.0.0.1" {
				break
			}
			if time.Now().After(deadline) {
				testDNS.err = errors.New("pebble-challtestsrv DNS on " + addr + " did not answer: " + errString(err) + " " + strings.Join(addrs, ","))
				srv.Shutdown()
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		testDNS.srv, testDNS.addr = srv, addr
	})
	if testDNS.err != nil {
		t.Fatal(testDNS.err)
	}
	return testDNS.addr
}

func errString(err error) string {
	if err == nil {
		return "no error"
	}
	return err.Error()
}

// testPebble is a running Pebble.
type testPebble struct {
	DirectoryURL string // the ACME directory, over HTTPS
	RootsFile    string // PEM that trusts the directory's HTTPS: --acme-ca-roots
	ca           *pebbleca.CAImpl
	wfe          *httptest.Server
}

// startPebble starts Pebble whose VA checks TLS-ALPN-01 on tlsPort and
// HTTP-01 on httpPort of whatever the test DNS says acmeDomain is.
func startPebble(t *testing.T, tlsPort, httpPort int) *testPebble {
	t.Helper()
	dnsAddr := startTestDNS(t)
	// Pebble reads these when its parts are made. NOSLEEP drops the random
	// 0-5 s wait before each validation; NONCEREJECT=0 stops it refusing 5%
	// of good nonces (the client retries those, but it costs time).
	t.Setenv("PEBBLE_VA_NOSLEEP", "1")
	t.Setenv("PEBBLE_WFE_NONCEREJECT", "0")

	logs := &syncBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pebble's log:\n%s", logs)
		}
	})
	logger := log.New(logs, "pebble ", log.Lmicroseconds)
	db := pebbledb.NewMemoryStore()
	ca := pebbleca.New(logger, db, "", "ecdsa", 0, 1, map[string]pebbleca.Profile{"default": {Description: "test"}})
	va := pebbleva.New(logger, httpPort, tlsPort, false, dnsAddr, db)
	wfe := pebblewfe.New(logger, db, va, ca, []string{"pebble.letsencrypt.org"}, false, false, 0, 0)

	// The directory is served over HTTPS with a certificate from a CA of
	// our own, which the relay trusts through --acme-ca-roots.
	webCA := newTLSTestCA(t)
	srv := httptest.NewUnstartedServer(wfe.Handler())
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{webCA.issue(t, "127.0.0.1")}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return &testPebble{DirectoryURL: srv.URL + pebblewfe.DirectoryPath, RootsFile: webCA.writeRootPEM(t), ca: ca, wfe: srv}
}

// issuerRoots trusts only the root Pebble issues from (a fresh random one).
func (p *testPebble) issuerRoots() (*x509.CertPool, *x509.Certificate) {
	root := p.ca.GetRootCert(0).Cert
	pool := x509.NewCertPool()
	pool.AddCert(root)
	return pool, root
}

func portOf(t *testing.T, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// closedPort is a loopback port nothing listens on.
func closedPort(t *testing.T) int {
	t.Helper()
	ln := listenLoopback(t)
	p := portOf(t, ln.Addr().String())
	ln.Close()
	return p
}

// checkIssuedByPebble verifies a handshake's chain up to Pebble's root and
// that the leaf is for acmeDomain only.
func checkIssuedByPebble(t *testing.T, cs tls.ConnectionState, root *x509.Certificate) {
	t.Helper()
	if len(cs.VerifiedChains) == 0 {
		t.Fatal("no verified chain")
	}
	chain := cs.VerifiedChains[0]
	leaf := chain[0]
	if len(leaf.DNSNames) != 1 || leaf.DNSNames[0] != acmeDomain {
		t.Errorf("leaf names %q, want [%s]", leaf.DNSNames, acmeDomain)
	}
	if !chain[len(chain)-1].Equal(root) {
		t.Errorf("chain ends at %q, want Pebble's root %q", chain[len(chain)-1].Subject, root.Subject)
	}
	if len(chain) < 3 {
		t.Errorf("chain of %d certificates; want leaf, Pebble's intermediate and root", len(chain))
	}
	if !strings.Contains(leaf.Issuer.CommonName, "Pebble") {
		t.Errorf("leaf issued by %q", leaf.Issuer.CommonName)
	}
}

// dialTo is a transport that reaches every name at 127.0.0.1 on the same
// port: the system resolver does not know acmeDomain.
func dialTo(roots *x509.CertPool) *http.Transport {
	return &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots},
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			_, port, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			var d net.Dialer
			return d.DialContext(ctx, network, net.JoinHostPort("127.0.0.1", port))
		},
	}
}

func TestACMECertificateByTLSALPN01(t *testing.T) {
	ln := listenLoopback(t)
	addr := ln.Addr().String()
	// Nothing answers HTTP-01, and HTTPHandler is never called: the only
	// way to a certificate is TLS-ALPN-01 on the relay's TLS listener.
	p := startPebble(t, portOf(t, addr), closedPort(t))
	cacheDir := t.TempDir()
	opts := certs.Options{
		Domains:      []string{acmeDomain},
		Email:        "ops@example.com",
		CacheDir:     cacheDir,
		DirectoryURL: p.DirectoryURL,
		CARootsFile:  p.RootsFile,
	}
	tl, err := certs.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	serveTLS(t, ln, tl.Config(), http.HandlerFunc(hello))
	roots, root := p.issuerRoots()

	// The first handshake waits while the relay gets its certificate.
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 2 * time.Minute}, "tcp", addr, &tls.Config{ServerName: acmeDomain, RootCAs: roots})
	if err != nil {
		t.Fatalf("handshake for %s: %v", acmeDomain, err)
	}
	cs := conn.ConnectionState()
	conn.Close()
	checkIssuedByPebble(t, cs, root)
	issued := cs.PeerCertificates[0]

	// HTTPS requests are served with it.
	tr := dialTo(roots)
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get("https://" + net.JoinHostPort(acmeDomain, strconv.Itoa(portOf(t, addr))) + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(string(body), "hello over") {
		t.Errorf("GET: %d %q", resp.StatusCode, body)
	}

	// A client without SNI (dialing the IP) gets the relay's certificate.
	conn, err = tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatalf("handshake without SNI: %v", err)
	}
	if got := conn.ConnectionState().PeerCertificates[0]; !got.Equal(issued) {
		t.Errorf("without SNI got a certificate for %q", got.DNSNames)
	}
	conn.Close()

	// A name outside the host policy gets no certificate: the handshake
	// fails on the relay's side (the client does not even check), and
	// nothing is asked of the CA or cached for it.
	const stranger = "other.calltap.test"
	conn, err = tls.Dial("tcp", addr, &tls.Config{ServerName: stranger, InsecureSkipVerify: true})
	if err == nil {
		names := conn.ConnectionState().PeerCertificates[0].DNSNames
		conn.Close()
		t.Fatalf("handshake for %s succeeded with a certificate for %q", stranger, names)
	}
	filepath.WalkDir(cacheDir, func(path string, d os.DirEntry, err error) error {
		if err == nil && strings.Contains(d.Name(), stranger) {
			t.Errorf("cache holds %s", path)
		}
		return nil
	})

	// A restarted relay serves the cached certificate without the CA.
	p.wfe.Close()
	tl2, err := certs.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ln2 := listenLoopback(t)
	serveTLS(t, ln2, tl2.Config(), http.HandlerFunc(hello))
	conn, err = tls.Dial("tcp", ln2.Addr().String(), &tls.Config{ServerName: acmeDomain, RootCAs: roots})
	if err != nil {
		t.Fatalf("handshake after restart, CA gone: %v", err)
	}
	if got := conn.ConnectionState().PeerCertificates[0]; !got.Equal(issued) {
		t.Error("after restart the relay served a different certificate")
	}
	conn.Close()
}

func TestACMECertificateByHTTP01AndRedirect(t *testing.T) {
	tlsLn := listenLoopback(t)
	httpLn := listenLoopback(t)
	tlsPort, httpPort := portOf(t, tlsLn.Addr().String()), portOf(t, httpLn.Addr().String())
	// The VA's TLS-ALPN-01 check goes to a closed port and fails, so the
	// certificate can only come through HTTP-01 on --http-listen.
	p := startPebble(t, closedPort(t), httpPort)
	tl, err := certs.New(certs.Options{
		Domains:      []string{acmeDomain},
		CacheDir:     t.TempDir(),
		DirectoryURL: p.DirectoryURL,
		CARootsFile:  p.RootsFile,
		HTTPSPort:    strconv.Itoa(tlsPort),
		Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)), // the failed TLS-ALPN-01 attempt warns
	})
	if err != nil {
		t.Fatal(err)
	}
	serveTLS(t, tlsLn, tl.Config(), http.HandlerFunc(hello))
	hs := &http.Server{Handler: tl.HTTPHandler(nil), ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	go hs.Serve(httpLn)
	t.Cleanup(func() { hs.Close() })

	roots, root := p.issuerRoots()
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 2 * time.Minute}, "tcp", tlsLn.Addr().String(), &tls.Config{ServerName: acmeDomain, RootCAs: roots})
	if err != nil {
		t.Fatalf("handshake for %s: %v", acmeDomain, err)
	}
	checkIssuedByPebble(t, conn.ConnectionState(), root)
	conn.Close()

	// Plain HTTP is redirected to the HTTPS listener, which answers.
	tr := dialTo(roots)
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get("http://" + net.JoinHostPort(acmeDomain, strconv.Itoa(httpPort)) + "/somewhere?x=1")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	want := "https://" + net.JoinHostPort(acmeDomain, strconv.Itoa(tlsPort)) + "/somewhere?x=1"
	if resp.StatusCode != 200 || resp.Request.URL.String() != want || !strings.HasPrefix(string(body), "hello over") {
		t.Errorf("GET over HTTP ended at %s with %d %q; want %s, 200", resp.Request.URL, resp.StatusCode, body, want)
	}
}

// TestACMERelayEndToEnd runs the relay on HTTPS with a certificate from
// Pebble; an agent connects over wss trusting only Pebble's root, and a
// webhook sent to the public https URL reaches the local handler, is
// saved by the agent, and its answer comes back to the sender.
func TestACMERelayEndToEnd(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ln := listenLoopback(t)
	addr := ln.Addr().String()
	p := startPebble(t, portOf(t, addr), closedPort(t))
	roots, root := p.issuerRoots()
	tl, err := certs.New(certs.Options{
		Domains:      []string{acmeDomain},
		Email:        "ops@example.com",
		CacheDir:     t.TempDir(),
		DirectoryURL: p.DirectoryURL,
		CARootsFile:  p.RootsFile,
		Logger:       quiet,
	})
	if err != nil {
		t.Fatal(err)
	}

	// The relay, as `calltap relay --domain relay.calltap.test --listen 127.0.0.1:PORT` runs it.
	dir := t.TempDir()
	relayDB, err := relaydb.Open(ctx, filepath.Join(dir, "relay.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { relayDB.Close() })
	pub, err := certs.PublicURL(acmeDomain, addr)
	if err != nil {
		t.Fatal(err)
	}
	info, err := relay.CreateToken(ctx, relayDB, "alice", pub)
	if err != nil {
		t.Fatal(err)
	}
	if want := "https://" + acmeDomain + ":" + strconv.Itoa(portOf(t, addr)) + "/t/" + info.TunnelID; info.URL != want {
		t.Errorf("tunnel URL %q, want %q", info.URL, want)
	}
	srv, err := relay.NewServer(ctx, relay.Config{Store: relayDB, PublicURL: pub, Logger: quiet, Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	hs := srv.HTTPServer(addr)
	hs.TLSConfig = tl.Config()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); srv.Run(ctx) }()
	go func() { defer wg.Done(); hs.ServeTLS(ln, "", "") }()
	t.Cleanup(func() {
		cancel()
		hs.Close()
		wg.Wait()
	})

	// Get the certificate before anyone connects, as the relay command does
	// after its listeners are up.
	obtainCtx, obtainDone := context.WithTimeout(ctx, 2*time.Minute)
	leaf, err := tl.Obtain(obtainCtx, acmeDomain)
	obtainDone()
	if err != nil {
		t.Fatalf("Obtain: %v", err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{DNSName: acmeDomain, Roots: roots, Intermediates: intermediates(p)}); err != nil {
		t.Fatalf("obtained certificate does not verify against Pebble's root: %v", err)
	}

	// The developer's local handler and agent.
	// The handler answers 201 and hands what it saw to the test.
	type seen struct {
		r    *http.Request
		body []byte
	}
	saw := make(chan seen, 4)
	local := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		saw <- seen{r.Clone(context.Background()), body}
		w.Header()["X-Reply"] = []string{"one", "two"}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "got %d bytes", len(body))
	}))
	defer local.Close()
	agentDB, err := agentdb.OpenAgent(ctx, filepath.Join(dir, "agent.db"))
	if err != nil {
		t.Fatal(err)
	}
	agent, err := agent.New(agent.Config{Store: agentDB, ForwardTo: local.URL + "/webhooks", Logger: quiet, ForwardTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	agentCtx, stopAgent := context.WithCancel(ctx)
	var agentWG sync.WaitGroup
	agentWG.Add(1)
	go func() { defer agentWG.Done(); agent.Run(agentCtx) }()
	// The agent dials the relay by address and checks the certificate for
	// the relay's name against Pebble's root only.
	client, err := tunnel.NewClient(tunnel.Config{
		RelayURL:   "https://" + addr,
		Token:      info.Token,
		Handler:    agent,
		TLSConfig:  &tls.Config{ServerName: acmeDomain, RootCAs: roots},
		Logger:     quiet,
		BackoffMin: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
		OnState: agent.SetConnState,
	})
	if err != nil {
		t.Fatal(err)
	}
	clientErr := make(chan error, 1)
	agentWG.Add(1)
	go func() { defer agentWG.Done(); clientErr <- client.Run(agentCtx) }()
	t.Cleanup(func() {
		stopAgent()
		agentWG.Wait()
		agentDB.Close()
	})
	deadline := time.Now().Add(30 * time.Second)
	for agent.TunnelState().State != tunnel.StateConnected {
		select {
		case err := <-clientErr:
			t.Fatalf("agent gave up: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent did not connect over wss: %+v", agent.TunnelState())
		}
		time.Sleep(10 * time.Millisecond)
	}

	// A webhook to the public https URL.
	tr := dialTo(roots)
	defer tr.CloseIdleConnections()
	var peer tls.ConnectionState
	tr.TLSClientConfig.VerifyConnection = func(cs tls.ConnectionState) error { peer = cs; return nil }
	event := `{"event":"call.ended","call":{"call_id":"c-1"}}`
	req, _ := http.NewRequest("POST", info.URL+"/events?attempt=1", strings.NewReader(event))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Add("X-Signature", "one")
	req.Header.Add("X-Signature", "two")
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || string(got) != "got "+strconv.Itoa(len(event))+" bytes" {
		t.Fatalf("sender got %d %q, want the local handler's 201", resp.StatusCode, got)
	}
	if v := resp.Header.Values("X-Reply"); len(v) != 2 {
		t.Errorf("X-Reply %q", v)
	}
	checkIssuedByPebble(t, peer, root)

	if len(saw) != 1 {
		t.Fatalf("local handler saw %d requests", len(saw))
	}
	got1 := <-saw
	r := got1.r
	if r.Method != "POST" || r.URL.EscapedPath() != "/webhooks/events" || r.URL.RawQuery != "attempt=1" || string(got1.body) != event {
		t.Errorf("local handler saw %s %s?%s %q", r.Method, r.URL.EscapedPath(), r.URL.RawQuery, got1.body)
	}
	if v := r.Header.Values("X-Signature"); len(v) != 2 || v[0] != "one" || v[1] != "two" {
		t.Errorf("X-Signature at the handler: %q", v)
	}
	caps, n, err := agentDB.Captures(ctx, agentdb.CaptureFilter{Page: storage.Page{Limit: 10}})
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 || caps[0].Event != "call.ended" || caps[0].CallID != "c-1" {
		t.Fatalf("agent stored %d captures %+v", n, caps)
	}
}

// intermediates is Pebble's intermediate, for verifying a bare leaf.
func intermediates(p *testPebble) *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(p.ca.GetIntermediateCert(0).Cert)
	return pool
}
