package main

import (
	"context"
)

func cmdDev(ctx context.Context, args []string, stdio Stdio) int {
	fs := newFlagSet("dev", "calltap dev --forward-to URL|--routes FILE [--listen 127.0.0.1:8080] [--inspect 127.0.0.1:4040] [--data DIR]",
		"Run relay, agent and inspector in one process on loopback: no token, no server. The tunnel URL stays the same\nacross restarts for a given --data directory.")
	var (
		af     agentFlags
		rf     relayFlags
		listen = fs.String("listen", "127.0.0.1:8080", "`address` of the local relay")
		pubURL = fs.String("public-url", "", "`url` senders use (default http://<listen>)")
	)
	af.register(fs)
	rf.register(fs, true)
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
