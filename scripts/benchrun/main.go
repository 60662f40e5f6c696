// Command benchrun is the measurement suite behind `make bench`
// (scripts/bench): a keep-alive HTTP load generator, the small handler it
// loads, and one subcommand per part of the suite. Each part appends rows
// to a results file; `benchrun report` prints them as one Markdown table
// with every target marked met or not. Everything runs on loopback.
//
//	benchrun handler   --listen 127.0.0.1:0           the local handler (prints its address)
//	benchrun tunnel    --bin bin/calltap --out FILE    direct vs through calltap, side by side
//	benchrun store     --out FILE                      capture store: captures/s, queries at 10⁶
//	benchrun routes    --bin bin/calltap --out FILE    routes check: a 10-route file over 10⁵ stored captures
//	benchrun scale     --out FILE                      idle tunnels: RSS, goroutines, accept rate
//	benchrun queue     --bin bin/calltap --out FILE    offline queue: enqueue and drain rates
//	benchrun reconnect --bin bin/calltap --out FILE    relay down 0/10/60 s → first request through
//	benchrun prune     --bin bin/calltap --out FILE    retention: p99 through the tunnel while 10⁵ captures are pruned, and after
//	benchrun cluster   --bin bin/calltap --out FILE    team relay over NATS: same node vs another, shared queue, NATS bytes
//	benchrun cost      --bin bin/calltap-prof --out FILE  per 2 KB request: each process's CPU, system calls, context switches; added p50 vs fsync p50; --perf: CPU by stage
//	                   --routes FILE                   every agent with this route file
//	                   --baseline BIN [--rounds N]     instead: this build and BIN in N interleaved rounds, after ÷ before
//	                   --routes-ab [--rounds N]        instead: the agent with the bench's 10-route file and with none, in N interleaved rounds, routes ÷ none
//	                   --claims-ab [--rounds N]        instead: the agent with 10 claims and with none, in N interleaved rounds, the relay's claims ÷ none
//	benchrun report    FILE                            the table
//
// It is a report, not a test: a missed target is printed, never an exit
// status. A part that cannot run at all exits non-zero.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: benchrun handler|tunnel|store|routes|scale|hold|queue|reconnect|prune|cluster|cost|report [flags]")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	args := os.Args[2:]
	switch os.Args[1] {
	case "handler":
		err = cmdHandler(ctx, args)
	case "tunnel":
		err = cmdTunnel(ctx, args)
	case "store":
		err = cmdStore(ctx, args)
	case "routes":
		err = cmdRoutes(ctx, args)
	case "scale":
		err = cmdScale(ctx, args)
	case "hold":
		err = cmdHold(ctx, args)
	case "queue":
		err = cmdQueue(ctx, args)
	case "reconnect":
		err = cmdReconnect(ctx, args)
	case "prune":
		err = cmdPrune(ctx, args)
	case "cluster":
		err = cmdCluster(ctx, args)
	case "cost":
		err = cmdCost(ctx, args)
	case "report":
		err = cmdReport(args)
	default:
		fmt.Fprintf(os.Stderr, "benchrun: unknown part %q\n", os.Args[1])
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "benchrun %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}
