package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
)

func cmdDev(ctx context.Context, args []string, stdio Stdio) int {
	fs := newFlagSet("dev", "calltap dev --forward-to URL [--listen 127.0.0.1:8080] [--inspect 127.0.0.1:4040] [--data DIR]",
		"Run relay, agent and inspector in one process on loopback: no token, no server. The tunnel URL stays the same\nacross restarts for a given --data directory.")
	var (
		af     agentFlags
		rf     relayFlags
		listen = fs.String("listen", "127.0.0.1:8080", "`address` of the local relay")
		pubURL = fs.String("public-url", "", "`url` senders use (default http://<listen>)")
	)
	af.register(fs)
	rf.register(fs, true)
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
	af.forwardTimeout = max(af.forwardTimeout, rf.forwardTimeout)
	af.allowPrivate = true // everything in dev is local: the emulator's media links are on loopback
	return runApp(ctx, stdio, "dev", &agentApp{flags: &af, stdio: stdio, log: log,
		devRelay: &devRelay{listen: *listen, publicURL: *pubURL, flags: rf}})
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
