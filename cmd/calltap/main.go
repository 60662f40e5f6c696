// Command calltap is a tunnel and inspector for voice-call webhooks: a
// public relay, an agent that captures every request in SQLite and forwards
// it to a local handler, a browser inspector that understands calls, and an
// emulator and client of the voice service's API.
//
// This package holds flags and wiring only.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func commands() map[string]command {
	return map[string]command{
		"dev":          {cmdDev, "run relay, agent and inspector in one process on loopback"},
		"listen":       {cmdListen, "connect to a relay, capture every request and forward it to a local handler"},
		"relay":        {cmdRelay, "run the public relay; 'relay token create|list|revoke' manages developers' tokens, 'relay claims' the seats of shared ones"},
		"requests":     {cmdRequests, "list captured requests from the local store"},
		"replay":       {cmdReplay, "re-send a captured request to the local handler or another URL"},
		"version":      {cmdVersion, "print the version"},
		"help":         {nil, "show the commands and the reference's topics; help COMMAND or help TOPIC for one"},
		"trigger":      {cmdTrigger, "send realistic call events to a URL (a whole call, or one kind)"},
		"mock-service": {cmdMockService, "run an emulator of the voice service on loopback"},
		"service":      {cmdService, "call the voice service's API: walk the delivery log, show a delivery, ask for a replay"},
		"backfill":     {cmdBackfill, "import the deliveries the service sent while the agent was away, from its delivery log"},
		"media":        {cmdMedia, "fetch fresh links to a call's recording and transcript and save the files"},
		"export":       {cmdExport, "write captures byte-exact as JSON Lines (or HAR, --format har), to keep or to hand to a teammate"},
		"import":       {cmdImport, "load an export into the local store"},
		"delete":       {cmdDelete, "delete captures (by ID, call or age) with their bodies, search entries and media"},
		"keep":         {cmdKeep, "mark captures that retention (--retain, --max-store) never prunes"},
		"routes":       {cmdRoutes, "check a route file against the stored captures: what each route would take, which calls would change route"},
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], Stdio{In: os.Stdin, Out: os.Stdout, Err: os.Stderr})
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdio Stdio) int {
	cmds := commands()
	if len(args) == 0 {
		usage(stdio.Err, cmds)
		return 2
	}
	name := args[0]
	switch name {
	case "help", "-h", "--help", "-help":
		return runHelp(ctx, args[1:], stdio, cmds)
	case "-v", "--version":
		name = "version"
	}
	c, ok := cmds[name]
	if !ok || c.run == nil {
		fmt.Fprintf(stdio.Err, "calltap: unknown command %q (see 'calltap help')\n", name)
		return 2
	}
	return c.run(ctx, args[1:], stdio)
}

func cmdVersion(ctx context.Context, args []string, stdio Stdio) int {
	fs := newFlagSet("version", "calltap version [--json]", "Print calltap's version.")
	asJSON := fs.Bool("json", false, `print {"version": …} as JSON`)
	if ok, code := parseFlags(fs, args, stdio); !ok {
		return code
	}
	if len(fs.args) > 0 {
		return usageError(stdio, "version", "unexpected argument %q", fs.args[0])
	}
	if *asJSON {
		json.NewEncoder(stdio.Out).Encode(struct {
			Version string `json:"version"`
		}{version})
		return 0
	}
	fmt.Fprintln(stdio.Out, "calltap", version)
	return 0
}
