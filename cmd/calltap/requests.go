package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/url"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/calltap/calltap/inspector"
	"github.com/calltap/calltap/inspector/agent"
	"github.com/calltap/calltap/relay/api"
	"github.com/calltap/calltap/storage/agentdb"
)

func cmdRequests(ctx context.Context, args []string, stdio Stdio) int {
	fs := newFlagSet("requests", "calltap requests [--id ID] [--event KIND] [--call-id ID] [--status 2xx|4xx|5xx|none] [--q TEXT] [--route NAME] [--limit N] [--offset N] [--data DIR] [--json]",
		"List captured requests from the local store, newest first. Works whether or not an agent is running.\nRead-only: it creates nothing, and says which store it read (or that there is none).")
	var (
		dataDir = fs.String("data", defaultDataDir(), "data `dir`ectory")
		event   = fs.String("event", "", "only this event `kind`, e.g. call.ended")
		callID  = fs.String("call-id", "", "only the call `id`")
		status  = fs.String("status", "", "only this status `class`: 2xx, 4xx, 5xx or none")
		text    = fs.String("q", "", "full-text search in bodies for `words`")
		route   = fs.String("route", "", "only the captures this `route` took (--routes; default, filtered)")
		limit   = fs.Int("limit", 20, "how many (at most 200)")
		offset  = fs.Int("offset", 0, "how many to skip")
		asJSON  = fs.Bool("json", false, "print the page object as JSON")
		id      = fs.String("id", "", "only this capture: its `id`, a unique prefix of one, or a delivery id (each of its captures); the other filters are then ignored")
	)
	if ok, code := parseFlags(fs, args, stdio); !ok {
		return code
	}
	if len(fs.args) > 0 {
		return usageError(stdio, "requests", "unexpected argument %q", fs.args[0])
	}
	q := url.Values{}
	q.Set("limit", fmt.Sprint(*limit))
	q.Set("offset", fmt.Sprint(*offset))
	q.Set("event", *event)
	q.Set("call_id", *callID)
	q.Set("status_class", *status)
	q.Set("q", *text)
	q.Set("route", *route)
	f, err := inspector.ParseCaptureFilter(q)
	if err != nil {
		return usageError(stdio, "requests", "%v", err.(*api.Error).Message)
	}
	db, path, err := readAgentDB(ctx, stdio, "requests", *dataDir, *text != "")
	if err != nil {
		return fail(stdio, "requests", err)
	}
	if db == nil {
		// As export does: no store is not an empty one.
		return fail(stdio, "requests", errors.New(noStore(path)))
	}
	defer db.Close()
	rows, count, err := listRequests(ctx, db, f, *id)
	if err != nil {
		return fail(stdio, "requests", err)
	}
	if *asJSON {
		out := make([]inspector.Summary, len(rows))
		for i, c := range rows {
			out[i] = inspector.SummaryOf(c)
		}
		json.NewEncoder(stdio.Out).Encode(api.NewPage(count, len(out), f.Offset, out))
		return 0
	}
	printRequests(stdio.Out, rows)
	fmt.Fprintf(stdio.Out, "%d of %d in %s\n", len(rows), count, path)
	return 0
}

// printRequests writes rows as a table, a line each.
func printRequests(w io.Writer, rows []*agentdb.Capture) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	routed := slices.ContainsFunc(rows, func(c *agentdb.Capture) bool { return c.Route != "" }) // else no ROUTE column: the table as before routes
	line := func(cells ...string) {
		if !routed {
			cells = slices.Delete(cells, 5, 6)
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	line("ID", "TIME", "METHOD", "PATH", "EVENT", "ROUTE", "STATUS", "FLAGS")
	for _, c := range rows {
		status := "-"
		if c.ResponseStatus > 0 {
			status = fmt.Sprint(c.ResponseStatus)
		}
		line(c.ID, c.CreatedAt.Local().Format(time.DateTime), c.Method, c.Path, cmp.Or(c.Event, "-"), cmp.Or(c.Route, "-"), status, requestFlags(c))
	}
	tw.Flush()
}

// requestFlags is the FLAGS column of a capture: what sets it apart.
func requestFlags(c *agentdb.Capture) string {
	flags := ""
	for _, f := range []struct {
		on   bool
		name string
	}{
		{c.Queued, "queued"}, {c.DuplicateOf != "", "duplicate"}, {c.ReplayOf != "", "replay"},
		{c.Status == agentdb.StatusFailed, "failed"},
		{c.Status == agentdb.StatusUnknown, "answer-unknown"}, // not a failure: the sender may have got the handler's answer
		{c.Status == agentdb.StatusStored, "stored-only"},     // sent nowhere: calltap answered the sender itself
	} {
		if f.on {
			flags += f.name + " "
		}
	}
	return flags
}

// listRequests is a page of the captures f selects, newest first, and
// their count; or, given a reference (--id), the captures it names.
func listRequests(ctx context.Context, db *agentdb.AgentStore, f agentdb.CaptureFilter, ref string) ([]*agentdb.Capture, int, error) {
	if ref == "" {
		return db.Captures(ctx, f)
	}
	refs, err := resolveRefs(ctx, db, []string{ref})
	if err != nil {
		return nil, 0, err
	}
	rows := slices.Clone(refs[0].Captures)
	slices.Reverse(rows) // newest first, as every listing
	return rows, len(rows), nil
}

func cmdReplay(ctx context.Context, args []string, stdio Stdio) int {
	fs := newFlagSet("replay", "calltap replay ID [--to URL] [--retry service [--time-scale F]] [--json]\n       calltap replay --call CALL_ID | --from FILE [--to URL] [--time-scale F] [--with-retries] [--header 'Name: value']… [--expect 2xx] [--expect-body-json path=value]… [--json]",
		"Re-send a captured request, byte-exact, to the local handler it went to (or --to), and store the result as a new\ncapture linked to the original. Works whether or not an agent is running. ID is a capture id, a unique prefix\nof one, or a delivery id (the payload's id, which trigger prints): of a delivery that came several times, the\noriginal is replayed.\n\nWith --call, re-fire a whole call's events in their original order, spaced as they first arrived (times\n--time-scale; 0 sends them back to back); with --from, those of an export, without a store. --expect checks each\nanswer and exits 1 naming every event that did not match: captured calls as regression tests of a handler.")
	var c replayCmd
	fs.StringVar(&c.dataDir, "data", defaultDataDir(), "data `dir`ectory")
	fs.StringVar(&c.to, "to", "", "send to this `url` instead")
	fs.StringVar(&c.retry, "retry", "", "`schedule`: 'service' retries like the voice service: 0, 30s, 2m, 8m, 32m on errors, 408, 429, 5xx")
	fs.Float64Var(&c.timeScale, "time-scale", 1, "multiply the retry delays (0.01 runs the schedule in 25 s), or with --call/--from the gaps between events (0: none)")
	fs.BoolVar(&c.asJSON, "json", false, "print the result as JSON")
	fs.StringVar(&c.call, "call", "", "replay every event of the call `id`, in order")
	fs.StringVar(&c.from, "from", "", "replay the captures of this export `file` (calltap export), without a store")
	fs.BoolVar(&c.retries, "with-retries", false, "with --call/--from: replay the service's retries of a delivery too, not just the first")
	fs.StringVar(&c.expect, "expect", "", "with --call/--from: the `status` class (2xx) or status each answer must have")
	fs.Var(&c.expectJSON, "expect-body-json", "with --call/--from: `path=value` every answer's JSON body must hold (repeatable)")
	fs.Var(&c.headers, "header", "with --call/--from: `'Name: value'` to send instead of the captured value, e.g. a secret the export masked (repeatable)")
	if ok, code := parseFlags(fs, args, stdio); !ok {
		return code
	}
	if c.call != "" || c.from != "" {
		return c.runCall(ctx, fs.args, stdio)
	}
	return c.runOne(ctx, fs.args, stdio)
}

// replayCmd is calltap replay's flags.
type replayCmd struct {
	dataDir, to, retry, call, from, expect string
	timeScale                              float64
	asJSON, retries                        bool
	expectJSON, headers                    stringList
}

// runCall replays a whole call (--call) or an export (--from).
func (c *replayCmd) runCall(ctx context.Context, args []string, stdio Stdio) int {
	if len(args) > 0 {
		return usageError(stdio, "replay", "give a capture ID or --call/--from, not both")
	}
	if c.retry != "" {
		return usageError(stdio, "replay", "--retry replays one capture; not with --call/--from")
	}
	r := &callReplay{callID: c.call, from: c.from, to: c.to, timeScale: c.timeScale, retries: c.retries, expect: c.expect, expectJSON: c.expectJSON, headers: c.headers, asJSON: c.asJSON}
	if err := r.validate(); err != nil {
		return usageError(stdio, "replay", "%v", err)
	}
	if c.from != "" {
		return c.replayExport(ctx, r, stdio)
	}
	db, err := agentDB(ctx, c.dataDir)
	if err != nil {
		return fail(stdio, "replay", err)
	}
	defer db.Close()
	return r.run(ctx, stdio, db)
}

// replayExport replays the captures of an export, loaded into a store of
// its own that is removed afterwards.
func (c *replayCmd) replayExport(ctx context.Context, r *callReplay, stdio Stdio) int {
	tmp, err := os.MkdirTemp("", "calltap-replay-")
	if err != nil {
		return fail(stdio, "replay", err)
	}
	defer os.RemoveAll(tmp)
	db, err := agentDB(ctx, tmp)
	if err != nil {
		return fail(stdio, "replay", err)
	}
	defer db.Close()
	masked, err := inspector.LoadExport(ctx, db, c.from)
	if err != nil {
		return fail(stdio, "replay", err)
	}
	// A masked secret goes out as the mask: say so, and how to give it,
	// rather than leave a 401 to puzzle over.
	given, _ := replayHeaders(c.headers)
	if missing, err := inspector.Unsupplied(ctx, db, masked, given); err != nil {
		return fail(stdio, "replay", err)
	} else if len(missing) > 0 {
		fmt.Fprintf(stdio.Err, "calltap replay: the export masked %s: sent as %s unless given with --header '%s: …'\n", strings.Join(missing, ", "), inspector.MaskedValue, missing[0])
	}
	return r.run(ctx, stdio, db)
}

// checkOne checks the flags of a one-capture replay.
func (c *replayCmd) checkOne(args []string) error {
	switch {
	case c.expect != "" || len(c.expectJSON) > 0 || c.retries || len(c.headers) > 0:
		return usagef("--expect, --expect-body-json, --header and --with-retries go with --call or --from")
	case len(args) != 1:
		return usagef("give one capture ID (or a prefix of one, or a delivery id)")
	case c.retry != "" && c.retry != "service":
		return usagef("--retry must be 'service'")
	case !(c.timeScale > 0) || math.IsInf(c.timeScale, 0):
		return usagef("--time-scale must be a positive number")
	}
	return nil
}

// runOne replays one capture, the original of the one named, and exits 1
// unless the new capture was delivered.
func (c *replayCmd) runOne(ctx context.Context, args []string, stdio Stdio) int {
	if err := c.checkOne(args); err != nil {
		return exitCode(stdio, "replay", err)
	}
	db, refs, err := openResolved(ctx, c.dataDir, args)
	if err != nil {
		return fail(stdio, "replay", err)
	}
	defer db.Close()
	orig := refs[0].Original().ID
	if note := refNote(refs[0], "replaying the original, "+orig); note != "" {
		fmt.Fprintf(stdio.Err, "calltap replay: %s\n", note)
	}
	rc, err := c.replay(ctx, db, orig)
	if err != nil {
		return fail(stdio, "replay", err)
	}
	if c.asJSON {
		d, err := inspector.CaptureDetail(ctx, db, rc.ID)
		if err != nil {
			return fail(stdio, "replay", err)
		}
		json.NewEncoder(stdio.Out).Encode(d)
		return 0
	}
	status := "no response"
	if rc.ResponseStatus > 0 {
		status = fmt.Sprint(rc.ResponseStatus)
	}
	fmt.Fprintf(stdio.Out, "replayed %s as %s → %s: %s (%d attempt(s))", orig, rc.ID, rc.Target, status, rc.Attempts)
	if rc.Error != "" {
		fmt.Fprintf(stdio.Out, " — %s", rc.Error)
	}
	fmt.Fprintln(stdio.Out)
	if rc.Status != "delivered" {
		return 1
	}
	return 0
}

// replay runs an agent on db, without a tunnel, for one replay of orig and
// its retries.
func (c *replayCmd) replay(ctx context.Context, db *agentdb.AgentStore, orig string) (*agentdb.Capture, error) {
	a, stop, err := startAgent(ctx, agent.Config{Store: db})
	if err != nil {
		return nil, err
	}
	defer stop()
	rc, err := a.ReplayAndWait(ctx, agent.ReplayOptions{ID: orig, To: c.to, Retry: c.retry, TimeScale: c.timeScale})
	return rc, apiMessage(err)
}
