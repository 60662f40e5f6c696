package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"unicode"

	"github.com/calltap/calltap/relay/tunnel"
)

func cmdListen(ctx context.Context, args []string, stdio Stdio) int {
	fs := newFlagSet("listen", "calltap listen --relay URL --token TOKEN --forward-to URL|--routes FILE [flags]",
		"Connect to a relay and receive your tunnel's requests: each is saved in SQLite, forwarded to the local handler,\nand shown in the inspector. Requests that arrived while you were away are delivered first, in order.")
	var (
		af       agentFlags
		relayURL = fs.String("relay", "", "the relay's `url`, e.g. https://relay.example.com; several nodes of one relay comma-separated")
		token    = fs.String("token", "", "your `token` (default $CALLTAP_TOKEN)")
		tokFile  = fs.String("token-file", "", "read your token from this `file` instead (kept out of the process list)")
		require  stringList
		caFile   = fs.String("relay-ca", "", "PEM `file` of extra roots to trust for the relay's certificate")
	)
	af.register(fs)
	fs.Var(&require, "require-header", "`'Name: value'` every sender must present, checked at the relay (repeatable)")
	fs.require("relay")
	if ok, code := parseFlags(fs, args, stdio); !ok {
		return code
	}
	if len(fs.args) > 0 {
		return usageError(stdio, "listen", "unexpected argument %q", fs.args[0])
	}
	tok, err := listenToken(*token, *tokFile, os.Getenv("CALLTAP_TOKEN"))
	if err != nil {
		return usageError(stdio, "listen", "%v", err)
	}
	if err := af.validate(); err != nil {
		return usageError(stdio, "listen", "%v", err)
	}
	log := newLogger(stdio, af.jsonLogs, false)
	var tlsCfg *tls.Config
	if *caFile != "" {
		pem, err := os.ReadFile(*caFile)
		if err != nil {
			return fail(stdio, "listen", err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return fail(stdio, "listen", fmt.Errorf("--relay-ca %s holds no PEM certificate", *caFile))
		}
		tlsCfg = &tls.Config{RootCAs: pool}
	}
	return runApp(ctx, stdio, "listen", &agentApp{flags: &af, stdio: stdio, log: log,
		tunnel: tunnel.Config{RelayURL: *relayURL, Token: tok, RequireHeaders: require, TLSConfig: tlsCfg}})
}

// listenToken picks the token from --token, --token-file or the
// environment, in that order, without the whitespace around it: a token
// pasted with a space, or a file or variable ending in a newline (\n or
// \r\n), is the token all the same, at either end.
func listenToken(flagValue, file, env string) (string, error) {
	if flagValue != "" && file != "" {
		return "", errors.New("give --token or --token-file, not both")
	}
	source, tok := "--token", flagValue
	switch {
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("--token-file: %v", err)
		}
		source, tok = "--token-file "+file, string(b)
	case flagValue == "":
		source, tok = "CALLTAP_TOKEN", env
	}
	tok = strings.TrimSpace(tok)
	if tok == "" {
		if source == "CALLTAP_TOKEN" {
			return "", errors.New("missing required flag --token (or --token-file, or set CALLTAP_TOKEN)")
		}
		return "", fmt.Errorf("%s is empty", source)
	}
	if i := strings.IndexFunc(tok, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }); i >= 0 {
		return "", fmt.Errorf("the token from %s has whitespace or a control character inside it; a calltap token has none", source)
	}
	return tok, nil
}
