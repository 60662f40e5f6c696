package certs_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/calltap/calltap/relay/certs"
)

// tlsTestCA is a throwaway certificate authority for tests.
type tlsTestCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newTLSTestCA(t *testing.T) *tlsTestCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          randSerial(t),
		Subject:               pkix.Name{CommonName: "calltap test root"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &tlsTestCA{cert: cert, key: key}
}

func randSerial(t *testing.T) *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// issue makes a server certificate for names (DNS names or IP addresses).
func (ca *tlsTestCA) issue(t *testing.T, names ...string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: randSerial(t),
		Subject:      pkix.Name{CommonName: names[0]},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
}

func (ca *tlsTestCA) pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// writeRootPEM writes the CA's certificate where --acme-ca-roots can read it.
func (ca *tlsTestCA) writeRootPEM(t *testing.T) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "roots.pem")
	if err := os.WriteFile(f, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// writeKeyPair writes c as PEM files for --tls-cert/--tls-key.
func writeKeyPair(t *testing.T, certFile, keyFile string, c tls.Certificate) {
	t.Helper()
	kb, err := x509.MarshalPKCS8PrivateKey(c.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Certificate[0]}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// serveTLS serves h over HTTPS on a fresh loopback port the way the relay
// command does (http.Server.ServeTLS with the TLS type's Config).
func serveTLS(t *testing.T, ln net.Listener, cfg *tls.Config, h http.Handler) {
	t.Helper()
	hs := &http.Server{Handler: h, TLSConfig: cfg, ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: log.New(io.Discard, "", 0)} // refused handshakes are expected here
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := hs.ServeTLS(ln, "", ""); !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("ServeTLS: %v", err)
		}
	}()
	t.Cleanup(func() {
		hs.Close()
		<-done
	})
}

func listenLoopback(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// handshake dials addr presenting serverName and returns the certificate
// the server chose.
func handshake(addr, serverName string, roots *x509.CertPool) (*x509.Certificate, error) {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 30 * time.Second}, "tcp", addr, &tls.Config{ServerName: serverName, RootCAs: roots})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0], nil
}

func hello(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello over "+r.Proto) }

func TestStaticCertificateAndReload(t *testing.T) {
	const domain = "relay.calltap.test"
	ca := newTLSTestCA(t)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	first := ca.issue(t, domain)
	writeKeyPair(t, certFile, keyFile, first)

	tl, err := certs.New(certs.Options{Domains: []string{domain}, CertFile: certFile, KeyFile: keyFile})
	if err != nil {
		t.Fatal(err)
	}
	ln := listenLoopback(t)
	serveTLS(t, ln, tl.Config(), http.HandlerFunc(hello))
	addr := ln.Addr().String()

	got, err := handshake(addr, domain, ca.pool())
	if err != nil {
		t.Fatalf("handshake with the static certificate: %v", err)
	}
	if got.SerialNumber.Cmp(first.Leaf.SerialNumber) != 0 {
		t.Fatalf("served serial %x, want %x", got.SerialNumber, first.Leaf.SerialNumber)
	}

	// A plain HTTPS request works through the same listener.
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.pool(), ServerName: domain}}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get("https://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(string(body), "hello over") {
		t.Fatalf("GET: %d %q", resp.StatusCode, body)
	}

	// The operator renews the pair and reloads: new handshakes get it.
	second := ca.issue(t, domain)
	writeKeyPair(t, certFile, keyFile, second)
	if err := tl.Reload(); err != nil {
		t.Fatal(err)
	}
	if got, err := handshake(addr, domain, ca.pool()); err != nil || got.SerialNumber.Cmp(second.Leaf.SerialNumber) != 0 {
		t.Fatalf("after Reload: err %v, serial %v, want %x", err, got, second.Leaf.SerialNumber)
	}

	// A broken pair is refused and the good one stays in service.
	if err := os.WriteFile(keyFile, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := tl.Reload(); err == nil {
		t.Fatal("Reload accepted a broken key")
	}
	if got, err := handshake(addr, domain, ca.pool()); err != nil || got.SerialNumber.Cmp(second.Leaf.SerialNumber) != 0 {
		t.Fatalf("after a failed Reload: err %v, want the previous certificate still served", err)
	}

	// A certificate that does not cover --domain is refused up front.
	other := ca.issue(t, "elsewhere.calltap.test")
	writeKeyPair(t, certFile, keyFile, other)
	if _, err := certs.New(certs.Options{Domains: []string{domain}, CertFile: certFile, KeyFile: keyFile}); err == nil || !strings.Contains(err.Error(), domain) {
		t.Fatalf("NewTLS with a certificate for another name: %v", err)
	}
}

func TestNewTLSRejectsBadOptions(t *testing.T) {
	dir := t.TempDir()
	for name, o := range map[string]certs.Options{
		"nothing":           {},
		"cert without key":  {CertFile: filepath.Join(dir, "c.pem")},
		"missing cert file": {CertFile: filepath.Join(dir, "c.pem"), KeyFile: filepath.Join(dir, "k.pem")},
		"no cache dir":      {Domains: []string{"relay.calltap.test"}},
		"url as domain":     {Domains: []string{"https://relay.calltap.test"}, CacheDir: dir},
		"wildcard":          {Domains: []string{"*.calltap.test"}, CacheDir: dir},
		"ip as domain":      {Domains: []string{"127.0.0.1"}, CacheDir: dir},
		"single label":      {Domains: []string{"relay"}, CacheDir: dir},
		"bad directory":     {Domains: []string{"relay.calltap.test"}, CacheDir: dir, DirectoryURL: "not a url"},
		"missing roots":     {Domains: []string{"relay.calltap.test"}, CacheDir: dir, CARootsFile: filepath.Join(dir, "none.pem")},
	} {
		if _, err := certs.New(o); err == nil {
			t.Errorf("%s: NewTLS accepted %+v", name, o)
		}
	}
	junk := filepath.Join(dir, "junk.pem")
	os.WriteFile(junk, []byte("no certificates here"), 0o644)
	if _, err := certs.New(certs.Options{Domains: []string{"relay.calltap.test"}, CacheDir: dir, CARootsFile: junk}); err == nil {
		t.Error("NewTLS accepted a roots file without certificates")
	}
	tl, err := certs.New(certs.Options{Domains: []string{" Relay.Calltap.Test. "}, CacheDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if d := tl.Domains(); len(d) != 1 || d[0] != "relay.calltap.test" {
		t.Errorf("Domains() = %q, want the name normalized", d)
	}
}

func TestHTTPRedirectsToHTTPS(t *testing.T) {
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	do := func(t *testing.T, base, method, host, path string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, strings.NewReader(`{"event":"call.ended"}`))
		req.Host = host
		resp, err := noFollow.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	ca := newTLSTestCA(t)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	writeKeyPair(t, certFile, keyFile, ca.issue(t, "relay.calltap.test", "alt.calltap.test"))

	for _, mode := range []struct {
		name string
		opts certs.Options
	}{
		// With ACME the handler also answers HTTP-01; nothing here reaches the CA.
		{"acme", certs.Options{CacheDir: dir, DirectoryURL: "https://127.0.0.1:1/dir"}},
		{"static", certs.Options{CertFile: certFile, KeyFile: keyFile}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			o := mode.opts
			o.Domains = []string{"relay.calltap.test", "alt.calltap.test"}
			o.HTTPSPort = "8443"
			tl, err := certs.New(o)
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(tl.HTTPHandler(nil))
			defer srv.Close()

			for _, c := range []struct{ method, host, path, want string }{
				// A webhook sent to http:// is redirected with its method kept (308).
				{"POST", "relay.calltap.test", "/t/abc/hooks?x=1&x=2", "https://relay.calltap.test:8443/t/abc/hooks?x=1&x=2"},
				{"GET", "alt.calltap.test:80", "/", "https://alt.calltap.test:8443/"},
				{"GET", "ALT.calltap.test", "/healthz", "https://alt.calltap.test:8443/healthz"},
				// A Host header the relay does not serve never becomes the target.
				{"GET", "evil.example", "/t/abc", "https://relay.calltap.test:8443/t/abc"},
			} {
				resp := do(t, srv.URL, c.method, c.host, c.path)
				if resp.StatusCode != http.StatusPermanentRedirect || resp.Header.Get("Location") != c.want {
					t.Errorf("%s %s%s: %d Location %q, want 308 %q", c.method, c.host, c.path, resp.StatusCode, resp.Header.Get("Location"), c.want)
				}
			}

			// ACME's challenge path is not redirected: unknown tokens are 404
			// (with ACME) and the static mode has no such path to serve.
			resp := do(t, srv.URL, "GET", "relay.calltap.test", "/.well-known/acme-challenge/nope")
			want := http.StatusNotFound
			if mode.name == "static" {
				want = http.StatusPermanentRedirect
			}
			if resp.StatusCode != want {
				t.Errorf("challenge path: %d, want %d", resp.StatusCode, want)
			}
		})
	}

	// On 443 the redirect carries no port; a fallback replaces the redirect.
	tl, err := certs.New(certs.Options{Domains: []string{"relay.calltap.test"}, CertFile: certFile, KeyFile: keyFile, HTTPSPort: "443"})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(tl.HTTPHandler(nil))
	defer srv.Close()
	if resp := do(t, srv.URL, "GET", "relay.calltap.test", "/x"); resp.Header.Get("Location") != "https://relay.calltap.test/x" {
		t.Errorf("Location %q, want https://relay.calltap.test/x", resp.Header.Get("Location"))
	}
	fb := httptest.NewServer(tl.HTTPHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) })))
	defer fb.Close()
	if resp := do(t, fb.URL, "GET", "relay.calltap.test", "/x"); resp.StatusCode != http.StatusTeapot {
		t.Errorf("fallback: %d, want 418", resp.StatusCode)
	}
}

func TestPublicURL(t *testing.T) {
	for _, c := range []struct{ domain, listen, want string }{
		{"relay.example.com", ":443", "https://relay.example.com"},
		{"relay.example.com", "0.0.0.0:https", "https://relay.example.com"},
		{"Relay.Example.com", ":8443", "https://relay.example.com:8443"},
		{"relay.example.com", "[::]:8443", "https://relay.example.com:8443"},
	} {
		got, err := certs.PublicURL(c.domain, c.listen)
		if err != nil || got != c.want {
			t.Errorf("PublicURL(%q, %q) = %q, %v; want %q", c.domain, c.listen, got, err, c.want)
		}
	}
	for _, c := range [][2]string{{"relay.example.com", "443"}, {"", ":443"}, {"http://x.example.com", ":443"}} {
		if got, err := certs.PublicURL(c[0], c[1]); err == nil {
			t.Errorf("PublicURL(%q, %q) = %q, want an error", c[0], c[1], got)
		}
	}
}
