package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/calltap/calltap/scripts/chaos/history"
)

// routesFile is the route file the agent runs with, in the run's folder.
const routesFile = "routes.toml"

// chaosRoutes are the agent's routes, in file order, each with a handler
// server of its own; what no route takes goes to the default's server
// (--forward-to). They exercise each way a route decides: by event kind
// (media, tried first, so that it takes alice's recordings too), and by a
// field of the body that only call.started carries (alice), which a call's
// later events must follow. There is no catch-all: the rest takes the
// default, the path every agent without a route file takes, and a request
// that fell through a route by mistake lands on a server the checker
// watches.
func chaosRoutes() []history.Route {
	return []history.Route{
		{Name: "media", Events: []string{"call.recording_*", "call.analysis_*"}},
		{Name: "alice", Developer: "alice"},
	}
}

// handlerNames are the handler servers a run starts: one per route, then
// the default's.
func handlerNames(rs []history.Route) []string {
	names := make([]string, 0, len(rs)+1)
	for _, r := range rs {
		names = append(names, r.Name)
	}
	return append(names, history.DefaultRoute)
}

// writeRoutes writes rs as the agent's route file at path, each route
// forwarding to its handler server's URL in urls.
func writeRoutes(path string, rs []history.Route, urls map[string]string) error {
	var b strings.Builder
	b.WriteString("# The agent's routes; scripts/chaos/check works out on its own where each request belongs.\n")
	for _, r := range rs {
		fmt.Fprintf(&b, "\n[[route]]\nname = %q\n", r.Name)
		if len(r.Events) > 0 {
			quoted := make([]string, len(r.Events))
			for i, e := range r.Events {
				quoted[i] = fmt.Sprintf("%q", e)
			}
			fmt.Fprintf(&b, "events = [%s]\n", strings.Join(quoted, ", "))
		}
		if r.Developer != "" {
			fmt.Fprintf(&b, "match = { \"call.variables.developer\" = %q }\n", r.Developer)
		}
		fmt.Fprintf(&b, "forward-to = %q\n", urls[r.Name])
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}
