package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/calltap/calltap/inspector/agent"
	"github.com/calltap/calltap/inspector/routes"
)

// routeFlags are --routes and --events of dev and listen.
type routeFlags struct {
	file   string
	events string
	loaded []byte // the file's contents the table in use came from
}

func (f *routeFlags) register(fs *flagSet) {
	fs.StringVar(&f.file, "routes", "", "route `file` (TOML): which local handler each request goes to; changes are taken without a restart (calltap help routes)")
	fs.StringVar(&f.events, "events", "", "forward only these event kinds, the rest stored only: a comma-separated `list` of globs, e.g. call.started,call.analysis_*")
}

// any reports whether routes are in use: a file or an event filter.
func (f *routeFlags) any() bool { return f.file != "" || f.events != "" }

// load reads and checks the route file and the event filter; cv is the
// memory of calls the table keeps them together with (nil when checking
// the flags, before the store is open).
func (f *routeFlags) load(cv routes.CallValues) (*routes.Table, error) {
	opts := f.options(cv)
	if f.file == "" {
		return routes.Parse("--events", nil, opts...)
	}
	t, data, err := routes.LoadBytes(f.file, opts...)
	f.loaded = data
	return t, err
}

// flagError names the flag whose value load refused.
func (f *routeFlags) flagError(err error) error {
	if f.file == "" {
		return fmt.Errorf("--events: %v", err)
	}
	return fmt.Errorf("--routes: %v", err)
}

func (f *routeFlags) options(cv routes.CallValues) []routes.Option {
	opts := []routes.Option{eventFilter(f.events)}
	if cv != nil {
		opts = append(opts, routes.WithCallValues(cv))
	}
	return opts
}

// watch takes a changed route file into a without a restart; a change
// that does not check is refused with one ERROR line, and the routes in
// use stay.
func (f *routeFlags) watch(a *agent.Agent, cv routes.CallValues, log *slog.Logger) func(context.Context) error {
	return func(ctx context.Context) error {
		routes.Watch(ctx, f.file, f.loaded, func(t *routes.Table) {
			a.SetRoutes(t)
			log.Info("routes reloaded", "file", f.file, "routes", t.Names())
		}, func(err error) {
			log.Error(fmt.Sprintf("routes: %v; the last good routes stay", err), "file", f.file)
		}, f.options(cv)...)
		return nil
	}
}
