package main

import (
	"errors"
	"log/slog"
	"net"
	"path/filepath"
	"strings"

	"github.com/calltap/calltap/relay/certs"
	"golang.org/x/crypto/acme/autocert"
)

// tlsFlags are the relay's certificate settings.
type tlsFlags struct {
	domains    string
	email      string
	directory  string
	caRoots    string
	certFile   string
	keyFile    string
	httpListen string

	// shared, set for a cluster node, keeps ACME's cache where every node finds it.
	shared func(directoryURL string) autocert.Cache
}

func (f *tlsFlags) register(fs *flagSet) {
	fs.StringVar(&f.domains, "domain", "", "public `names` of the relay, comma-separated: certificates come from ACME (Let's Encrypt) automatically")
	fs.StringVar(&f.email, "acme-email", "", "contact `email` address for the ACME account")
	fs.StringVar(&f.directory, "acme-directory", "", "ACME directory `url` of another CA (staging, or a test CA such as Pebble)")
	fs.StringVar(&f.caRoots, "acme-ca-roots", "", "PEM `file` of roots to trust when talking to --acme-directory")
	fs.StringVar(&f.certFile, "tls-cert", "", "serve this certificate `file` (PEM) instead of getting one by ACME")
	fs.StringVar(&f.keyFile, "tls-key", "", "key `file` of --tls-cert (PEM)")
	fs.StringVar(&f.httpListen, "http-listen", ":80", "plain-HTTP listener `address` for ACME HTTP-01 and redirects to HTTPS (empty: none)")
}

func (f *tlsFlags) validate(insecure bool) error {
	static := f.certFile != "" || f.keyFile != ""
	if static && (f.certFile == "" || f.keyFile == "") {
		return errors.New("--tls-cert and --tls-key go together")
	}
	if insecure && (static || f.domains != "") {
		return errors.New("--insecure-http cannot be combined with --domain or --tls-cert")
	}
	if !insecure && !static && f.domains == "" {
		return errors.New("give --domain (automatic HTTPS), --tls-cert/--tls-key, or --insecure-http")
	}
	return nil
}

// publicURL derives the relay's URL from its domain and listener.
func (f *tlsFlags) publicURL(listen string, insecure bool) string {
	scheme := "https"
	if insecure {
		scheme = "http"
	}
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		host, port = listen, ""
	}
	if f.domains != "" {
		host = strings.TrimSpace(strings.Split(f.domains, ",")[0])
		if !insecure {
			if u, err := certs.PublicURL(host, listen); err == nil {
				return u
			}
		}
	} else if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	if (scheme == "https" && port == "443") || (scheme == "http" && port == "80") || port == "" {
		return scheme + "://" + host
	}
	return scheme + "://" + net.JoinHostPort(host, port)
}

// build returns the TLS config for the main listener and the handler for
// --http-listen: ACME HTTP-01 answers and a redirect to HTTPS.
func (f *tlsFlags) build(dataDir, listen string, log *slog.Logger) (*certs.TLS, error) {
	var domains []string
	for _, d := range strings.Split(f.domains, ",") {
		if d = strings.TrimSpace(d); d != "" {
			domains = append(domains, d)
		}
	}
	_, port, _ := net.SplitHostPort(listen)
	t, err := certs.New(certs.Options{
		Domains: domains, Email: f.email, CacheDir: filepath.Join(dataDir, "autocert"),
		DirectoryURL: f.directory, CARootsFile: f.caRoots, CertFile: f.certFile, KeyFile: f.keyFile,
		HTTPSPort: port, Logger: log, SharedCache: f.shared,
	})
	if err != nil {
		return nil, err
	}
	return t, nil
}
