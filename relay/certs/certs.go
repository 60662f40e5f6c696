// Package certs is HTTPS for the public relay: certificates from an ACME
// CA (Let's Encrypt by default) through autocert, or a certificate the
// operator provides. (Not named acme: it imports golang.org/x/crypto/acme,
// and serves static pairs as well.)
package certs

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"

	"golang.org/x/crypto/acme"
	"golang.org/x/crypto/acme/autocert"
)

// Options are the relay's certificate settings (flags --domain,
// --acme-email, --acme-directory, --acme-ca-roots, --tls-cert, --tls-key).
type Options struct {
	// Domains are the relay's public names. With ACME they are the host
	// policy: no other name gets a certificate, whatever a client asks for.
	Domains []string

	Email    string // ACME account contact (optional)
	CacheDir string // ACME account key and certificates; required with ACME
	// SharedCache, when set, keeps them instead where every relay node
	// of a cluster finds them; it is given the CA's directory URL.
	SharedCache  func(directoryURL string) autocert.Cache
	DirectoryURL string // ACME directory; "" is Let's Encrypt production
	CARootsFile  string // PEM roots trusted, besides the system's, when talking to DirectoryURL

	// CertFile and KeyFile serve a certificate the operator manages instead
	// of ACME. Reload picks up a renewed pair.
	CertFile, KeyFile string

	// HTTPSPort is the TLS listener's port, where HTTPHandler redirects
	// to; "" means 443.
	HTTPSPort string

	Logger *slog.Logger // default slog.Default()
}

// TLS is the relay's certificate source: ACME through autocert, or a static
// pair. Use Config for the TLS listener and HTTPHandler for the plain-HTTP
// one.
type TLS struct {
	domains   []string // normalized, lower case
	httpsPort string
	log       *slog.Logger

	// manager is nil when serving a static certificate.
	manager *autocert.Manager

	certFile, keyFile string
	static            atomic.Pointer[tls.Certificate] // swapped by Reload
}

// New checks o and prepares the certificate source. It does not contact
// the CA: the first certificate is obtained on the first handshake for a
// name in Domains (or by Obtain), because the CA's TLS-ALPN-01 check needs
// the listener to be serving already.
func New(o Options) (*TLS, error) {
	t := &TLS{httpsPort: o.HTTPSPort, log: o.Logger, certFile: o.CertFile, keyFile: o.KeyFile}
	if t.log == nil {
		t.log = slog.Default()
	}
	if t.httpsPort == "443" || t.httpsPort == "https" {
		t.httpsPort = ""
	}
	for _, d := range o.Domains {
		n, err := normalizeDomain(d)
		if err != nil {
			return nil, err
		}
		t.domains = append(t.domains, n)
	}
	if o.CertFile != "" || o.KeyFile != "" {
		if o.CertFile == "" || o.KeyFile == "" {
			return nil, errors.New("--tls-cert and --tls-key go together")
		}
		if err := t.Reload(); err != nil {
			return nil, err
		}
		return t, nil
	}
	m, err := newManager(o, t.domains)
	if err != nil {
		return nil, err
	}
	t.manager = m
	return t, nil
}

// newManager is the ACME side of New: autocert for domains, with the CA,
// trust and cache o names.
func newManager(o Options, domains []string) (*autocert.Manager, error) {
	if len(domains) == 0 {
		return nil, errors.New("automatic certificates need at least one --domain")
	}
	if o.CacheDir == "" && o.SharedCache == nil {
		// Without a cache every restart would ask the CA again and soon
		// hit its rate limits.
		return nil, errors.New("automatic certificates need a cache directory")
	}
	client, err := acmeClient(o.DirectoryURL, o.CARootsFile)
	if err != nil {
		return nil, err
	}
	var cache autocert.Cache = autocert.DirCache(cacheDirFor(o.CacheDir, client.DirectoryURL))
	if o.SharedCache != nil {
		cache = o.SharedCache(client.DirectoryURL)
	}
	return &autocert.Manager{
		// Running the relay with --domain is the operator accepting the
		// CA's terms; there is nobody to prompt.
		Prompt:     autocert.AcceptTOS,
		Cache:      cache,
		HostPolicy: autocert.HostWhitelist(domains...),
		Email:      o.Email,
		Client:     client,
	}, nil
}

// acmeClient talks to the CA at directoryURL ("" is Let's Encrypt
// production), trusting the roots in rootsFile besides the system's.
func acmeClient(directoryURL, rootsFile string) (*acme.Client, error) {
	dir := directoryURL
	if dir == "" {
		dir = autocert.DefaultACMEDirectory
	}
	u, err := url.Parse(dir)
	if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return nil, fmt.Errorf("--acme-directory %q: want an https URL", directoryURL)
	}
	client := &acme.Client{DirectoryURL: dir, UserAgent: "calltap-relay"}
	if rootsFile != "" {
		hc, err := httpClientTrusting(rootsFile)
		if err != nil {
			return nil, err
		}
		client.HTTPClient = hc
	}
	return client, nil
}

// cacheDirFor keeps each CA's account and certificates apart: autocert
// keys its cache by name only, so after switching from a staging CA to the
// real one the relay would go on serving the staging certificate.
func cacheDirFor(base, directoryURL string) string {
	if directoryURL == autocert.DefaultACMEDirectory {
		return base
	}
	u, _ := url.Parse(directoryURL)
	host := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '-':
			return r
		}
		return '_'
	}, u.Host)
	sum := sha256.Sum256([]byte(directoryURL))
	return filepath.Join(base, host+"-"+hex.EncodeToString(sum[:4]))
}

func httpClientTrusting(file string) (*http.Client, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("--acme-ca-roots: %w", err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--acme-ca-roots %s: no PEM certificate in it", file)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	return &http.Client{Transport: tr}, nil
}

func normalizeDomain(d string) (string, error) {
	n := strings.TrimSuffix(strings.ToLower(strings.TrimSpace(d)), ".")
	if n == "" || !strings.Contains(n, ".") || strings.ContainsAny(n, ":/*@ \t") || net.ParseIP(n) != nil {
		return "", fmt.Errorf("--domain %q: want a DNS name such as relay.example.com", d)
	}
	return n, nil
}

// Domains are the normalized names the relay serves.
func (t *TLS) Domains() []string { return append([]string(nil), t.domains...) }

// Config is the TLS configuration of the public listener. With ACME it
// answers TLS-ALPN-01 challenges (ALPN "acme-tls/1") on the same port.
//
// It offers only HTTP/1.1: agents' websockets need it. http.Server.ServeTLS
// adds "h2" for ordinary HTTPS clients, which leaves the agents alone
// (gorilla's dialer offers no ALPN unless its tls.Config lists some); serve
// with tls.NewListener instead to keep HTTP/1.1 only.
func (t *TLS) Config() *tls.Config {
	cfg := &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: t.getCertificate,
		NextProtos:     []string{"http/1.1"},
	}
	if t.manager != nil {
		cfg.NextProtos = append(cfg.NextProtos, acme.ALPNProto)
	}
	return cfg
}

func (t *TLS) getCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	if t.manager == nil {
		return t.static.Load(), nil
	}
	if hello.ServerName == "" {
		// Clients that dial by IP send no SNI; give them the primary name's
		// certificate rather than a bare handshake failure.
		h := *hello
		h.ServerName = t.domains[0]
		hello = &h
	}
	cert, err := t.manager.GetCertificate(hello)
	if err != nil && t.allowed(hello.ServerName) && !isChallenge(hello) {
		// The http.Server logs handshake errors only at debug level; a
		// failure to get the relay's own certificate must be seen.
		t.log.Warn("no certificate for the relay's domain", "domain", hello.ServerName, "err", err)
	}
	return cert, err
}

func isChallenge(hello *tls.ClientHelloInfo) bool {
	return len(hello.SupportedProtos) == 1 && hello.SupportedProtos[0] == acme.ALPNProto
}

func (t *TLS) allowed(name string) bool {
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	for _, d := range t.domains {
		if d == name {
			return true
		}
	}
	return false
}

// Obtain returns the certificate for name, asking the CA when there is no
// valid one in the cache. The TLS listener must already be serving: the CA
// connects to it to check the TLS-ALPN-01 challenge. Call it after start-up
// to learn at once whether issuance works rather than at the first webhook.
func (t *TLS) Obtain(ctx context.Context, name string) (*x509.Certificate, error) {
	type result struct {
		cert *tls.Certificate
		err  error
	}
	done := make(chan result, 1)
	go func() {
		// autocert bounds the work with its own timeout; ctx only bounds
		// how long the caller waits.
		// An ECDSA suite: the certificate real clients get, not autocert's
		// RSA fallback for clients without ECDSA.
		c, err := t.getCertificate(&tls.ClientHelloInfo{
			ServerName:   name,
			CipherSuites: []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256},
		})
		done <- result{c, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			return nil, r.err
		}
		return leafOf(r.cert)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func leafOf(c *tls.Certificate) (*x509.Certificate, error) {
	if c.Leaf != nil {
		return c.Leaf, nil
	}
	if len(c.Certificate) == 0 {
		return nil, errors.New("empty certificate")
	}
	return x509.ParseCertificate(c.Certificate[0])
}

// Reload reads --tls-cert/--tls-key again, e.g. on SIGHUP after the
// operator renewed them. Handshakes in progress keep the old pair; a bad
// new pair is refused and the old one stays. With ACME it does nothing:
// autocert renews by itself.
func (t *TLS) Reload() error {
	if t.manager != nil {
		return nil
	}
	cert, err := tls.LoadX509KeyPair(t.certFile, t.keyFile)
	if err != nil {
		return fmt.Errorf("load --tls-cert/--tls-key: %w", err)
	}
	leaf, err := leafOf(&cert)
	if err != nil {
		return fmt.Errorf("load --tls-cert: %w", err)
	}
	for _, d := range t.domains {
		if err := leaf.VerifyHostname(d); err != nil {
			return fmt.Errorf("--tls-cert does not cover --domain %s: %w", d, err)
		}
	}
	cert.Leaf = leaf
	t.static.Store(&cert)
	return nil
}

// HTTPHandler serves --http-listen: ACME HTTP-01 challenges (with ACME),
// and everything else through fallback, or, when fallback is nil, a
// redirect to the same path on HTTPS.
//
// The redirect is 308 so that a POST stays a POST with its body; the
// target host is one of the relay's domains, never an arbitrary Host
// header.
func (t *TLS) HTTPHandler(fallback http.Handler) http.Handler {
	if fallback == nil {
		fallback = http.HandlerFunc(t.redirect)
	}
	if t.manager == nil {
		return fallback
	}
	acmeHandler := t.manager.HTTPHandler(fallback)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// autocert checks the Host header against the host policy as it
		// comes, port included; behind a port mapping, or on a port other
		// than 80, it would refuse the CA's challenge request.
		if h, _, err := net.SplitHostPort(r.Host); err == nil {
			r = r.Clone(r.Context())
			r.Host = h
		}
		acmeHandler.ServeHTTP(w, r)
	})
}

func (t *TLS) redirect(w http.ResponseWriter, r *http.Request) {
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if len(t.domains) > 0 && !t.allowed(host) {
		host = t.domains[0]
	}
	if host == "" {
		http.Error(w, "use HTTPS", http.StatusBadRequest)
		return
	}
	if t.httpsPort != "" {
		host = net.JoinHostPort(host, t.httpsPort)
	} else if strings.Contains(host, ":") {
		host = "[" + host + "]" // an IPv6 literal
	}
	http.Redirect(w, r, "https://"+host+r.URL.RequestURI(), http.StatusPermanentRedirect)
}

// PublicURL is the relay's URL for domain served on the listen address:
// https://domain, with the port when it is not 443.
func PublicURL(domain, listen string) (string, error) {
	d, err := normalizeDomain(domain)
	if err != nil {
		return "", err
	}
	_, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", fmt.Errorf("--listen %q: %w", listen, err)
	}
	if port == "" || port == "443" || port == "https" {
		return "https://" + d, nil
	}
	return "https://" + net.JoinHostPort(d, port), nil
}
