package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/calltap/calltap/inspector/agent"
	"github.com/calltap/calltap/inspector/voice/trigger"
	"github.com/calltap/calltap/relay/wire"
)

func cmdBackfill(ctx context.Context, args []string, stdio Stdio) int {
	fs := newFlagSet("backfill", "calltap backfill [--since 2h] [--call-id ID] [--forward --forward-to URL] [--data DIR] [--json]",
		"Find the deliveries in the voice service's log that never reached this machine (sent while the laptop\n"+
			"was off and no relay queue held them), fetch each exact payload and import it into the local store,\n"+
			"marked as backfilled, so the inspector shows it. With --forward each is also sent on to the local\n"+
			"handler, oldest first. Running it again imports nothing new. Deliveries the service has not tried\n"+
			"yet are left alone: they are still on their way.\n"+serviceHelp)
	var sf serviceFlags
	sf.register(fs)
	var (
		since     = fs.Duration("since", 2*time.Hour, "look at deliveries created within this window; 0 for the whole log")
		callID    = fs.String("call-id", "", "only the deliveries of the call `id`")
		forward   = fs.Bool("forward", false, "send each imported delivery on to the local handler (--forward-to)")
		forwardTo = fs.String("forward-to", "", "the local handler's `url`, e.g. http://127.0.0.1:3000/webhooks (implies --forward)")
		dataDir   = fs.String("data", defaultDataDir(), "data `dir`ectory (the agent's store)")
		asJSON    = fs.Bool("json", false, "print a summary as JSON")
		headers   stringList
	)
	fs.Var(&headers, "header", "`'Name: value'` added to each imported request, e.g. the Authorization your handler checks\n(the delivery log does not keep event_webhook_headers; repeatable)")
	if ok, code := parseFlags(fs, args, stdio); !ok {
		return code
	}
	if *forwardTo != "" {
		*forward = true
	}
	extra, err := checkBackfill(fs.args, *since, *forward, *forwardTo, headers)
	if err != nil {
		return exitCode(stdio, "backfill", err)
	}
	c, err := sf.client(stdio, "backfill")
	if err != nil {
		return serviceFail(stdio, "backfill", err)
	}

	db, err := agentDB(ctx, *dataDir)
	if err != nil {
		return fail(stdio, "backfill", err)
	}
	defer db.Close()
	// Media links of backfilled events are saved too, if they have not expired.
	cfg := agent.Config{Store: db, ForwardTo: *forwardTo, MediaDir: filepath.Join(*dataDir, "media")}
	if *forward && !*asJSON {
		cfg.Console = stdio.Out // one line per forwarded request, as listen prints
	}
	// The agent outlives an interrupt until the backfill has returned.
	a, stop, err := startAgent(context.Background(), cfg)
	if err != nil {
		return fail(stdio, "backfill", err)
	}
	defer stop()

	status := newStatusLine(stdio.Err)
	res, err := a.Backfill(ctx, c, agent.BackfillOptions{
		Since: *since, CallID: *callID, Forward: *forward, Header: extra,
		Progress: backfillProgress(status, *forward),
	})
	status.done()
	if err != nil {
		if res.Imported > 0 {
			err = fmt.Errorf("%w (%d imported before it)", err, res.Imported)
		}
		return serviceFail(stdio, "backfill", err)
	}
	if *asJSON {
		json.NewEncoder(stdio.Out).Encode(res)
		return 0
	}
	res.WriteReport(stdio.Out, *since, *forward)
	return 0
}

// checkBackfill checks the flags and reads the headers to add.
func checkBackfill(args []string, since time.Duration, forward bool, forwardTo string, headers []string) (wire.Header, error) {
	switch {
	case len(args) > 0:
		return nil, usagef("unexpected argument %q", args[0])
	case since < 0:
		return nil, usagef("--since must be positive, or 0 for the whole log")
	case forward && forwardTo == "":
		return nil, usagef("--forward needs --forward-to URL, the local handler")
	}
	if forwardTo != "" {
		if _, err := agent.ParseTarget(forwardTo); err != nil {
			return nil, usagef("--forward-to: %v", err)
		}
	}
	var extra wire.Header
	for _, h := range headers {
		f, err := trigger.ParseHeader(h)
		if err != nil {
			return nil, usagef("%s", strings.TrimPrefix(err.Error(), "trigger: "))
		}
		extra = append(extra, f)
	}
	return extra, nil
}

// backfillProgress shows a backfill's progress on one status line.
func backfillProgress(status *statusLine, forward bool) func(agent.BackfillProgress) {
	return func(p agent.BackfillProgress) { status.show(p.Line(forward), p.Phase == "done") }
}
