package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"net/url"
	"path/filepath"
	"regexp"
	"strconv"
	"time"

	"github.com/calltap/calltap/scripts/benchrun/load"
	"github.com/calltap/calltap/storage"
	"github.com/calltap/calltap/storage/agentdb"
	"github.com/google/uuid"
)

// cmdPrune measures what retention costs the answer path: the p99 of
// requests through the tunnel while the agent prunes --n old captures,
// beside the p99 of the same load once the prune is over.
func cmdPrune(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("prune", flag.ContinueOnError)
	bin := fs.String("bin", "bin/calltap", "the calltap binary")
	out := fs.String("out", "", "results file")
	n := fs.Int("n", 100_000, "old captures the agent prunes")
	dur := fs.Duration("duration", 3*time.Second, "each measured window")
	conns := fs.Int("c", 8, "concurrent senders")
	if err := fs.Parse(args); err != nil {
		return err
	}
	pt, err := openPart(*out, "", "prune")
	if err != nil {
		return err
	}
	defer pt.close()
	if err := seedOld(ctx, filepath.Join(pt.dir, "agent", "agent.db"), *n); err != nil {
		return err
	}
	if err := pt.withRelay(ctx, *bin, relayFlagsNoLimits...); err != nil {
		return err
	}
	res, ct := pt.res, pt.ct
	// The agent's default retention (30 days) prunes the 60-day-old
	// captures as it starts.
	if err := ct.startAgent(ctx, true); err != nil {
		return err
	}
	ev, stamp := jsonEvent2K()
	u, _ := url.Parse(ct.relayURL)
	spec := load.Spec{Addr: u.Host, Path: ct.tunnelPath + "/voice", Body: ev, Stamp: stamp, ContentType: "application/json",
		Conns: *conns, Warmup: 200 * time.Millisecond, Duration: *dur}
	var left0, left1 int
	spec.OnStart = func() { left0, _ = oldLeft(ct.inspectURL) }
	spec.OnEnd = func() { left1, _ = oldLeft(ct.inspectURL) }
	during, err := load.Run(ctx, spec)
	if err != nil {
		return err
	}
	if left0 == 0 || left1 == left0 {
		return fmt.Errorf("the prune was not running during the measure (%d old captures at the start, %d at the end)", left0, left1)
	}
	if err := poll(ctx, 10*time.Minute, 100*time.Millisecond, "the prune did not end", func() bool {
		n, err := oldLeft(ct.inspectURL)
		return err == nil && n == 0
	}); err != nil {
		return err
	}
	spec.OnStart, spec.OnEnd = nil, nil
	after, err := load.Run(ctx, spec)
	if err != nil {
		return err
	}
	res.add(row{Measure: fmt.Sprintf("Retention: p50 / p99 through the tunnel (2 KB events, c=%d) while the agent prunes %s old captures (%s of them during the window), beside after it",
		*conns, fmtCount(*n), fmtCount(left0-left1)),
		Direct:  fmt.Sprintf("after: %s / %s", fmtDur(after.Pct(50)), fmtDur(after.Pct(99))),
		Calltap: fmt.Sprintf("during: %s / %s", fmtDur(during.Pct(50)), fmtDur(during.Pct(99))),
		Ratio:   fmt.Sprintf("%.2f×", float64(during.Pct(99))/float64(max(after.Pct(99), 1)))})
	return nil
}

// seedOld saves n captures 60 days old into the agent store at path.
func seedOld(ctx context.Context, path string, n int) error {
	db, err := agentdb.OpenAgent(ctx, path, agentdb.WithSync(storage.SyncNormal))
	if err != nil {
		return err
	}
	defer db.Close()
	old := time.Now().Add(-60 * 24 * time.Hour)
	ev, _ := jsonEvent2K()
	for i := 0; i < n; i += 1000 {
		batch := make([]*agentdb.Capture, 0, 1000)
		for j := i; j < min(i+1000, n); j++ {
			batch = append(batch, &agentdb.Capture{ID: uuid.NewString(), Source: "tunnel", CreatedAt: old.Add(time.Duration(j) * time.Millisecond),
				Method: "POST", Path: "/voice", RequestHeaders: `[["Content-Type","application/json"]]`, Body: ev,
				Event: "call.ended", CallID: fmt.Sprintf("call-%d", j/5), DeliveryID: uuid.NewString(), Status: agentdb.StatusDelivered, MaxAttempts: 1, Duration: -1})
		}
		if _, err := db.WriteCaptures(ctx, batch, nil); err != nil {
			return err
		}
	}
	return db.CatchUpSearch(ctx)
}

var countField = regexp.MustCompile(`"count":\s*(\d+)`)

// oldLeft counts the captures older than a day that the agent still has.
func oldLeft(inspectURL string) (int, error) {
	b, err := getBody(inspectURL + "/api/v1/ext/webhooks/?limit=1&until=" + url.QueryEscape(time.Now().Add(-24*time.Hour).UTC().Format(time.RFC3339)))
	if err != nil {
		return 0, err
	}
	m := countField.FindSubmatch(bytes.TrimSpace(b))
	if m == nil {
		return 0, fmt.Errorf("no count in %s", b)
	}
	return strconv.Atoi(string(m[1]))
}
