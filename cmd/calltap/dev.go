package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/calltap/calltap/relay"
)

func cmdDev(ctx context.Context, args []string, stdio Stdio) int {
	fs := newFlagSet("dev", "calltap dev --forward-to URL [--listen 127.0.0.1:8080] [--inspect 127.0.0.1:4040] [--data DIR]",
		"Run relay, agent and inspector in one process on loopback: no token, no server. The tunnel URL stays the same\nacross restarts for a given --data directory.")
	var (
		af     agentFlags
		rf     relayFlags
		listen = fs.String("listen", "127.0.0.1:8080", "address of the local relay")
		pubURL = fs.String("public-url", "", "URL senders use (default http://<listen>)")
	)
	af.register(fs)
	rf.register(fs)
	fs.require("forward-to")
	if ok, code := parseFlags(fs, args, stdio); !ok {
		return code
	}
	if len(fs.args) > 0 {
		return usageError(stdio, "dev", "unexpected argument %q", fs.args[0])
	}
	if err := af.validate(); err != nil {
		return usageError(stdio, "dev", "%v", err)
	}
	if err := rf.validate(); err != nil {
		return usageError(stdio, "dev", "%v", err)
	}
	log := newLogger(stdio, af.jsonLogs, false)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	db, err := relayDB(ctx, af.dataDir, af.sync.option())
	if err != nil {
		return fail(stdio, "dev", err)
	}
	defer db.Close()
	token, err := devToken(af.dataDir)
	if err != nil {
		return fail(stdio, "dev", err)
	}
	if _, err := relay.EnsureToken(ctx, db, "dev", token); err != nil {
		return fail(stdio, "dev", err)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fail(stdio, "dev", err)
	}
	pub := *pubURL
	if pub == "" {
		pub = "http://" + ln.Addr().String()
	}
	cfg := rf.config(db, pub)
	cfg.Logger = log
	srv, err := relay.NewServer(ctx, cfg)
	if err != nil {
		ln.Close()
		return fail(stdio, "dev", err)
	}
	hs := srv.HTTPServer(*listen)
	go srv.Run(ctx)
	go hs.Serve(ln)
	defer hs.Close()

	af.forwardTimeout = max(af.forwardTimeout, rf.forwardTimeout)
	af.allowPrivate = true // everything in dev is local: the emulator's media links are on loopback
	rt, err := startAgent(ctx, &af, stdio, log)
	if err != nil {
		return fail(stdio, "dev", err)
	}
	defer rt.close()
	err = runTunnel(ctx, rt, relay.ClientConfig{RelayURL: "http://" + ln.Addr().String(), Token: token, Logger: log}, af.forwardTo, stdio)
	if err != nil {
		return fail(stdio, "dev", err)
	}
	return 0
}

// devToken is the local token of `calltap dev`, kept in the data directory
// so the tunnel id (and URL) survive restarts.
func devToken(dataDir string) (string, error) {
	path := filepath.Join(dataDir, "dev-token")
	if b, err := os.ReadFile(path); err == nil {
		if t := strings.TrimSpace(string(b)); t != "" {
			return t, nil
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	var b [32]byte
	rand.Read(b[:])
	t := "ct_dev_" + base64.RawURLEncoding.EncodeToString(b[:])
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return "", err
	}
	return t, os.WriteFile(path, []byte(t+"\n"), 0o600)
}
