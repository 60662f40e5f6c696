package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/calltap/calltap/scripts/benchrun/load"
)

// cmdReconnect stops the relay process under a connected agent, keeps it
// down for a while, starts it again on the same address and data, and
// times the first request that reaches the handler through the tunnel.
// The relay runs with --offline reject, so a request sent before the agent
// is back is refused (503) instead of queued, and cannot be mistaken for
// one that went through.
func cmdReconnect(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("reconnect", flag.ContinueOnError)
	bin := fs.String("bin", "bin/calltap", "the calltap binary")
	out := fs.String("out", "", "results file")
	downs := fs.String("down", "0s,10s,60s", "how long the relay stays down, one measurement each")
	if err := fs.Parse(args); err != nil {
		return err
	}
	waits, err := parseDurations(*downs)
	if err != nil {
		return err
	}
	pt, err := openPart(*out, "", "reconnect")
	if err != nil {
		return err
	}
	defer pt.close()
	if err := pt.withRelay(ctx, *bin, append(relayFlagsNoLimits, "--offline", "reject")...); err != nil {
		return err
	}
	res, ct := pt.res, pt.ct
	if err := ct.startAgent(ctx, true); err != nil {
		return err
	}
	tunnel := ct.relayURL + ct.tunnelPath + "/voice"
	through := func() bool {
		resp, err := httpc.Post(tunnel, "application/json", bytes.NewReader([]byte(`{"event":"call.started"}`)))
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	if !through() {
		return fmt.Errorf("no request goes through before the relay restarts")
	}
	for _, down := range waits {
		fmt.Fprintf(os.Stderr, "reconnect: relay down for %s\n", down)
		ct.relay.stop()
		load.Sleep(ctx, down)
		if err := ct.startRelay(ctx); err != nil { // returns once /healthz answers
			return err
		}
		back := time.Now()
		if err := poll(ctx, 2*time.Minute, 2*time.Millisecond, "no request went through after the relay came back", through); err != nil {
			return err
		}
		took := time.Since(back)
		res.add(row{Measure: "Reconnect: relay down " + down.String() + " → first request through, from the relay answering again",
			Calltap: fmtDur(took), Target: "≤ 2 s", Met: verdict(took <= 2*time.Second)})
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return nil
}

// parseDurations reads --down, a comma-separated list of durations.
func parseDurations(list string) ([]time.Duration, error) {
	var ds []time.Duration
	for _, s := range strings.Split(list, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("--down: %v", err)
		}
		ds = append(ds, d)
	}
	return ds, nil
}
