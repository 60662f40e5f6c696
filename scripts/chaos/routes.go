package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/calltap/calltap/scripts/chaos/history"
)

// routesFile is the route file the default agent runs with, in the run's folder.
const routesFile = "routes.toml"

// chaosRoutes are the default agent's routes, in file order, each with a
// handler server of its own; what no route takes goes to the default's
// server (--forward-to). They exercise each way a route decides: by event
// kind (media, tried first, so that it takes the developer's recordings
// too), and by a field of the body that only call.started carries
// (developer: alice in single mode; in team mode, where alice's calls go
// to her own agent, dave, whom nobody claims), which a call's later events
// must follow. There is no catch-all: the rest takes the default, the path
// every agent without a route file takes, and a request that fell through
// a route by mistake lands on a server the checker watches.
func chaosRoutes(developer string) []history.Route {
	return []history.Route{
		{Name: "media", Events: []string{"call.recording_*", "call.analysis_*"}},
		{Name: developer, Developer: developer},
	}
}

// handlerServers are the handler servers a run starts: the default
// agent's, one per route, then its default's; then one for each claimant's
// agent, which has no route file.
func handlerServers(rs []history.Route, cs []history.Claimant) []server {
	srvs := make([]server, 0, len(rs)+1+len(cs))
	for _, r := range rs {
		srvs = append(srvs, server{route: r.Name})
	}
	srvs = append(srvs, server{route: history.DefaultRoute})
	for _, c := range cs {
		srvs = append(srvs, server{seat: c.Name, route: history.DefaultRoute})
	}
	return srvs
}

// routeURLs are the URLs of the default agent's servers, by route name.
func routeURLs(urls map[server]string) map[string]string {
	out := map[string]string{}
	for sv, u := range urls {
		if sv.seat == "" {
			out[sv.route] = u
		}
	}
	return out
}

// writeRoutes writes rs as the default agent's route file at path, each route
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
