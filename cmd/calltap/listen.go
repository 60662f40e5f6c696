package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/calltap/calltap/inspector"
	"github.com/calltap/calltap/inspector/agent"
	"github.com/calltap/calltap/inspector/voice/callevent"
	"github.com/calltap/calltap/relay/tunnel"
	"github.com/calltap/calltap/storage/agentdb"
)

// agentFlags are the agent's and inspector's settings, shared by listen and dev.
type agentFlags struct {
	forwardTo      string
	inspect        string
	inspectHosts   stringList
	inspectToken   string
	dataDir        string
	forwardTimeout time.Duration
	jsonLogs       bool
	quiet          bool
	rewriteMedia   bool
	allowPrivate   bool
	pendingAfter   time.Duration
	sync           syncFlag
	retention      retentionFlags
}

func (f *agentFlags) register(fs *flagSet) {
	fs.StringVar(&f.forwardTo, "forward-to", "", "the local handler's `url`, e.g. http://127.0.0.1:3000/webhooks (the rest of the tunnel path and the query are appended)")
	fs.StringVar(&f.inspect, "inspect", "127.0.0.1:4040", "`address` of the inspector (browser UI and JSON API); empty to disable")
	fs.Var(&f.inspectHosts, "inspect-host", "extra `host` name the inspector accepts, or its whole origin when a proxy serves it (https://name) (repeatable)")
	fs.StringVar(&f.inspectToken, "inspect-token", "", "`token` the inspector requires (needed to bind beyond loopback)")
	fs.StringVar(&f.dataDir, "data", defaultDataDir(), "data `dir`ectory: captures, saved media")
	fs.DurationVar(&f.forwardTimeout, "handler-timeout", 30*time.Second, "how long the local handler may take")
	fs.BoolVar(&f.jsonLogs, "log-json", false, "log as JSON")
	fs.BoolVar(&f.quiet, "quiet", false, "do not print a line per request")
	fs.BoolVar(&f.rewriteMedia, "rewrite-media", false, "replays point media links at the copies the agent saved (the signed originals expire)")
	fs.BoolVar(&f.allowPrivate, "allow-private-media", false, "let media links point at loopback or private addresses (on in dev)")
	fs.DurationVar(&f.pendingAfter, "analysis-pending-after", callevent.DefaultAnalysisPendingAfter, "flag a call whose call.analysis_completed has not come this long after call.ended")
	f.sync.register(fs)
	f.retention.register(fs)
}

func (f *agentFlags) validate() error {
	if _, err := agent.ParseTarget(f.forwardTo); err != nil {
		return fmt.Errorf("--forward-to: %v", err)
	}
	for _, h := range f.inspectHosts {
		if err := inspector.ValidInspectHost(h); err != nil {
			return fmt.Errorf("--inspect-host %v", err)
		}
	}
	if f.inspect != "" {
		host, _, err := net.SplitHostPort(f.inspect)
		if err != nil {
			return fmt.Errorf("--inspect %q: want host:port", f.inspect)
		}
		ip := net.ParseIP(host)
		loopback := host == "localhost" || (ip != nil && ip.IsLoopback())
		if !loopback && f.inspectToken == "" {
			return fmt.Errorf("--inspect %s is beyond loopback: set --inspect-token too", f.inspect)
		}
	}
	return nil
}

func agentDB(ctx context.Context, dataDir string, opts ...agentdb.Option) (*agentdb.AgentStore, error) {
	return agentdb.OpenAgent(ctx, filepath.Join(dataDir, "agent.db"), opts...)
}

func cmdListen(ctx context.Context, args []string, stdio Stdio) int {
	fs := newFlagSet("listen", "calltap listen --relay URL --token TOKEN --forward-to URL [flags]",
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
	fs.require("relay", "forward-to")
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

// refusalReportEvery is how often the console sums up refused senders.
const refusalReportEvery = 10 * time.Second

// refusalReport turns the relay's running count of senders refused for a
// missing --require-header into console lines: the first refusals at once,
// then at most one line per interval with the count since the last line,
// so that a flood of refusals prints a few lines, not one each.
type refusalReport struct {
	out   io.Writer
	every time.Duration

	mu         sync.Mutex
	seen       int64       // the relay's count last heard
	unreported int64       // refusals not printed yet
	printedAt  time.Time   // when the last line was printed
	timer      *time.Timer // pending summary; nil when none
	stopped    bool
}

// note takes the relay's running count. The count only grows while the
// relay runs; a smaller one (a connection's first state, or a restarted
// relay) adds nothing.
func (r *refusalReport) note(total int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if total <= r.seen || r.stopped {
		return
	}
	r.unreported += total - r.seen
	r.seen = total
	if r.timer != nil {
		return // the summary due will carry these
	}
	if wait := time.Until(r.printedAt.Add(r.every)); wait > 0 {
		r.timer = time.AfterFunc(wait, r.summarise)
		return
	}
	r.printLocked("")
}

// summarise prints what came in since the last line, an interval ago.
func (r *refusalReport) summarise() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.timer = nil
	if !r.stopped {
		r.printLocked(" in the last " + r.every.String())
	}
}

// stop prints what was not reported yet and ends the summaries.
func (r *refusalReport) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.timer != nil {
		r.timer.Stop()
		r.timer = nil
	}
	r.printLocked("")
	r.stopped = true
}

func (r *refusalReport) printLocked(period string) {
	if r.unreported == 0 {
		return
	}
	fmt.Fprintf(r.out, "  relay refused %d request(s) without the required header%s\n", r.unreported, period)
	r.unreported = 0
	r.printedAt = time.Now()
}
