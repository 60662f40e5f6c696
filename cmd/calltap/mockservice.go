package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/calltap/calltap/inspector/voice/emulator"
)

func cmdMockService(ctx context.Context, args []string, stdio Stdio) int {
	fs := newFlagSet("mock-service", "calltap mock-service --api-key 'KEY=SCOPE,SCOPE' [flags]",
		"Run an emulator of the voice service on loopback: the API under /api/v1/ext/ (dispatch a call with\nPOST /calls/dispatch/, the delivery log, replay, media, contacts) and webhook deliveries with the\ndocumented retries, so that whole calls run offline.")
	var (
		listen    = fs.String("listen", "127.0.0.1:9090", "`address` to serve the API on")
		keys      stringList
		keysFile  = fs.String("api-keys-file", "", "`file` of API keys, one 'key=scope,scope' a line (# comments)")
		timeScale = fs.Float64("time-scale", 1, "multiply every wait (call timings, retry delays) by this; 0.01 runs 100× faster")
		allowHTTP = fs.Bool("allow-http-webhooks", false, "admit http:// webhook URLs on loopback hosts (https is required otherwise)")
		timeout   = fs.Duration("delivery-timeout", 10*time.Second, "time after which a delivery attempt counts as failed")
		mediaTTL  = fs.Duration("media-expires-in", time.Hour, "lifetime of signed media links (not scaled)")
		dataDir   = fs.String("data", filepath.Join(defaultDataDir(), "mock-service"), "data `dir`ectory of the emulator's state (service.db)")
		seed      = fs.Int("seed", 0, "on an empty database, create N contacts and N past calls with their deliveries")
		publicURL = fs.String("public-url", "", "the emulator's `url` as clients reach it, for media links (default: from --listen)")
		jsonLogs  = fs.Bool("log-json", false, "log as JSON")
		quiet     = fs.Bool("quiet", false, "do not log a line per delivery attempt")
	)
	fs.Var(&keys, "api-key", "API key and its scopes, `key=scopes`, e.g. 'key=webhooks:read,webhooks:write' (repeatable)")
	if ok, code := parseFlags(fs, args, stdio); !ok {
		return code
	}
	cfgKeys, err := mockServiceKeys(fs.args, keys, *keysFile)
	if err == nil {
		err = checkMockService(cfgKeys, *timeScale, *timeout, *mediaTTL, *seed, *listen)
	}
	if err != nil {
		return exitCode(stdio, "mock-service", err)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fail(stdio, "mock-service", err)
	}
	defer ln.Close()
	pub := *publicURL
	if pub == "" {
		pub = "http://" + reachableAddr(ln.Addr().(*net.TCPAddr))
	}
	deliveryLog := newLogger(stdio, *jsonLogs, false)
	if *quiet {
		// Attempts are logged at Info; faults of the emulator still show.
		deliveryLog = newLevelLogger(stdio, *jsonLogs, slog.LevelWarn)
	}
	srv, err := emulator.New(emulator.Config{
		Keys:              cfgKeys,
		DataDir:           *dataDir,
		TimeScale:         *timeScale,
		AllowHTTPWebhooks: *allowHTTP,
		DeliveryTimeout:   *timeout,
		MediaExpiresIn:    *mediaTTL,
		Seed:              *seed,
		PublicURL:         pub,
		Log:               deliveryLog,
	})
	if err != nil {
		return fail(stdio, "mock-service", err)
	}
	defer srv.Close()

	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 60 * time.Second, IdleTimeout: 2 * time.Minute}
	fmt.Fprintf(stdio.Out, "calltap mock-service: API at %s%s/ (%d key(s), time scale %g, data %s)\n", pub, emulator.Prefix, len(cfgKeys), *timeScale, *dataDir)
	if err := runParts(ctx, srv.Run, serveHTTP(hs, ln, httpGrace)); err != nil {
		return fail(stdio, "mock-service", err)
	}
	return 0
}

// mockServiceKeys reads the API keys of --api-key and --api-keys-file.
func mockServiceKeys(args []string, keys stringList, keysFile string) ([]emulator.Key, error) {
	if len(args) > 0 {
		return nil, usagef("unexpected argument %q", args[0])
	}
	var cfgKeys []emulator.Key
	for _, spec := range keys {
		k, err := emulator.ParseKey(spec)
		if err != nil {
			return nil, usagef("--api-key: %v", err)
		}
		cfgKeys = append(cfgKeys, k)
	}
	if keysFile == "" {
		return cfgKeys, nil
	}
	f, err := os.Open(keysFile)
	if err != nil {
		return nil, usagef("--api-keys-file: %v", err)
	}
	defer f.Close()
	fileKeys, err := emulator.ParseKeys(f)
	if err != nil {
		return nil, usagef("--api-keys-file %s: %v", keysFile, err)
	}
	return append(cfgKeys, fileKeys...), nil
}

// checkMockService checks the emulator's flags' ranges.
func checkMockService(keys []emulator.Key, timeScale float64, timeout, mediaTTL time.Duration, seed int, listen string) error {
	switch {
	case len(keys) == 0:
		return usagef("no API key: give --api-key 'key=webhooks:read,webhooks:write' or --api-keys-file")
	case timeScale <= 0 || timeScale > 1000:
		return usagef("--time-scale must be above 0 and at most 1000")
	case timeout <= 0:
		return usagef("--delivery-timeout must be positive")
	case mediaTTL < time.Second:
		return usagef("--media-expires-in must be at least 1s")
	case seed < 0 || seed > 10000:
		return usagef("--seed must be between 0 and 10000")
	}
	if _, _, err := net.SplitHostPort(listen); err != nil {
		return usagef("--listen %q: want host:port", listen)
	}
	return nil
}

// reachableAddr is addr as a client dials it: an unspecified host (":9090")
// becomes loopback.
func reachableAddr(addr *net.TCPAddr) string {
	ip := addr.IP
	if ip == nil || ip.IsUnspecified() {
		ip = net.IPv4(127, 0, 0, 1)
	}
	return net.JoinHostPort(ip.String(), fmt.Sprint(addr.Port))
}
