package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"

	"github.com/calltap/calltap/inspector/routes"
	"github.com/calltap/calltap/relay/wire"
	"github.com/calltap/calltap/storage/agentdb"
)

// changedShown is how many changed calls the text output lists; --json
// lists them all.
const changedShown = 50

func cmdRoutes(ctx context.Context, args []string, stdio Stdio) int {
	if len(args) == 0 {
		return usageError(stdio, "routes", "want a command: check")
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "-help" {
		fmt.Fprint(stdio.Out, "Usage: calltap routes check FILE [--data DIR] [--events LIST] [--json]\n\nWork with a route file: which local handler each request goes to.\n\nCommands:\n  check   what a route file would do with the stored captures: per route counts, and the calls that would change route\n")
		return 0
	}
	if args[0] != "check" {
		return usageError(stdio, "routes", "unknown command %q: want check", args[0])
	}
	return cmdRoutesCheck(ctx, args[1:], stdio)
}

func cmdRoutesCheck(ctx context.Context, args []string, stdio Stdio) int {
	fs := newFlagSet("routes", "calltap routes check FILE [--data DIR] [--events LIST] [--json]",
		"Check a route file and run the stored captures through it, in arrival order, as the agent would: count the\ncaptures each route would take, and list the calls that would change route compared with what they took.\nRead-only. A file that does not parse or check exits 2 with its file, line and what is wrong.")
	var (
		dataDir = fs.String("data", defaultDataDir(), "data `dir`ectory")
		events  = fs.String("events", "", "only these event kinds are routed, the rest stored only: a comma-separated `list` of globs, e.g. call.started,call.analysis_*")
		asJSON  = fs.Bool("json", false, `print {"routes": {"name": count, ...}, "changed_calls": [...], ...} as JSON`)
	)
	if ok, code := parseFlags(fs, args, stdio); !ok {
		return code
	}
	if len(fs.args) != 1 {
		return usageError(stdio, "routes", "want one route FILE, got %d arguments", len(fs.args))
	}
	table, err := routes.Load(fs.args[0], eventFilter(*events), routes.WithCallValues(routes.NewMemory()))
	if err != nil {
		fmt.Fprintf(stdio.Err, "calltap routes: %v\n", err)
		return 2
	}
	db, path, err := readAgentDB(ctx, stdio, "routes", *dataDir, false)
	if err != nil {
		return fail(stdio, "routes", err)
	}
	if db == nil {
		return fail(stdio, "routes", errors.New(noStore(path)))
	}
	defer db.Close()
	report, err := whatIf(ctx, db, table)
	if err != nil {
		return fail(stdio, "routes", err)
	}
	if *asJSON {
		json.NewEncoder(stdio.Out).Encode(report)
		return 0
	}
	printWhatIf(stdio.Out, report)
	fmt.Fprintf(stdio.Out, "%s against %d capture(s) in %s\n", fs.args[0], report.Captures, path)
	return 0
}

// whatIf runs every stored capture through table, oldest first, so that
// a call's later events recall what its earlier ones carried.
func whatIf(ctx context.Context, db *agentdb.AgentStore, table *routes.Table) (routes.Report, error) {
	tally := routes.NewTally(table)
	_, err := db.EachCapture(ctx, agentdb.CaptureFilter{}, func(c *agentdb.Capture) error {
		var h wire.Header
		if err := h.UnmarshalJSON([]byte(c.RequestHeaders)); err != nil {
			return fmt.Errorf("capture %s: stored headers unreadable: %v", c.ID, err)
		}
		req := routes.Request{Body: c.Body, Path: c.Path, Event: c.Event}
		if table.UsesHeaders() {
			req.Header = http.Header{}
			h.Apply(req.Header)
		}
		d := table.Match(req)
		tally.Add(d, tookRoute(c))
		return nil
	})
	return tally.Report(), err
}

// tookRoute is the route a capture took; one saved without a route file
// went to --forward-to, the default.
func tookRoute(c *agentdb.Capture) string {
	if c.Route == "" {
		return routes.DefaultName
	}
	return c.Route
}

func printWhatIf(w io.Writer, r routes.Report) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ROUTE\tCAPTURES")
	for _, name := range r.Order {
		fmt.Fprintf(tw, "%s\t%d\n", name, r.Routes[name])
	}
	tw.Flush()
	fmt.Fprintf(w, "\n%d call(s) would change route (%d capture(s) in all)\n", len(r.ChangedCalls), r.ChangedCaptures)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for i, c := range r.ChangedCalls {
		if i == changedShown {
			fmt.Fprintf(tw, "… and %d more (--json lists them all)\n", len(r.ChangedCalls)-i)
			break
		}
		fmt.Fprintf(tw, "  %s\t%s -> %s\t%d capture(s)\n", c.CallID, strings.Join(c.Took, ", "), strings.Join(c.Would, ", "), c.Captures)
	}
	tw.Flush()
}

// eventFilter is the table option of --events: none when it is empty.
func eventFilter(list string) routes.Option {
	if list == "" {
		return func(*routes.Table) {}
	}
	return routes.WithEvents(strings.Split(list, ","))
}
