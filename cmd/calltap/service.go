package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/calltap/calltap/inspector/voice/service"
)

// serviceHelp explains where the service's address and key come from; it
// ends the -h of every command that calls the service.
const serviceHelp = `
The service's address and key:
  base URL  --base-url, else $CALLTAP_BASE_URL, else base_url in the config file
            (the documentation's {base_url}, ending in /api/v1/ext/)
  API key   $CALLTAP_API_KEY, else api_key in the config file (never a flag:
            it would show in ps and shell history)
The config file is $XDG_CONFIG_HOME/calltap/config (default ~/.config/calltap/config)
or --config FILE: key = value lines, # comments, for example
  base_url = https://voice.example.com/api/v1/ext/
  api_key  = <API_KEY>
Keep it private (chmod 600). Reading the delivery log needs the webhooks:read
scope, replay needs webhooks:write.`

// serviceFlags are the flags of every command that calls the service.
type serviceFlags struct {
	baseURL string
	config  string
}

func (f *serviceFlags) register(fs *flagSet) {
	fs.StringVar(&f.baseURL, "base-url", "", "the service's API `url`, ending in /api/v1/ext/ (default: $CALLTAP_BASE_URL or the config file)")
	fs.StringVar(&f.config, "config", "", "config `file` (default $XDG_CONFIG_HOME/calltap/config or ~/.config/calltap/config)")
}

// client builds the service client from the flags, the environment and
// the config file. Warnings (a config file others can read) go to stdio.Err.
func (f *serviceFlags) client(stdio Stdio, cmd string) (*service.Client, error) {
	warn := func(w string) { fmt.Fprintf(stdio.Err, "calltap %s: warning: %s\n", cmd, w) }
	return service.Open(service.Settings{BaseURL: f.baseURL, ConfigFile: f.config, Warn: warn}, service.WithUserAgent("calltap/"+version))
}

func cmdService(ctx context.Context, args []string, stdio Stdio) int {
	const help = `Usage: calltap service <command> [flags]

Call the voice service's API.

Commands:
  deliveries [--call-id ID] [--since D]  walk the delivery log (every page, by the documented paging rules)
  delivery ID [--payload]                one delivery; --payload prints the exact bytes that were sent
  replay ID                              ask the service to re-send a delivery (after fixing the handler)

Run 'calltap service <command> -h' for its flags.
` + serviceHelp + "\n"
	if len(args) == 0 {
		return usageError(stdio, "service", "give a command: deliveries, delivery or replay")
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdio.Out, help)
		return 0
	case "deliveries":
		return cmdServiceDeliveries(ctx, args[1:], stdio)
	case "delivery":
		return cmdServiceDelivery(ctx, args[1:], stdio)
	case "replay":
		return cmdServiceReplay(ctx, args[1:], stdio)
	}
	return usageError(stdio, "service", "unknown command %q: want deliveries, delivery or replay", args[0])
}

// serviceFail prints a configuration problem as a usage error and anything
// else as a failure, one line each.
func serviceFail(stdio Stdio, cmd string, err error) int {
	if errors.Is(err, service.ErrNotConfigured) {
		return usageError(stdio, cmd, "%v", err)
	}
	if errors.Is(err, context.Canceled) {
		return fail(stdio, cmd, errors.New("interrupted"))
	}
	return fail(stdio, cmd, err)
}

func cmdServiceDeliveries(ctx context.Context, args []string, stdio Stdio) int {
	const name = "service deliveries"
	fs := newFlagSet(name, "calltap service deliveries [--call-id ID] [--since 2h] [--json]",
		"List the service's webhook deliveries, newest first. The whole log is walked page by page as the\ndocumentation says (the page size received moves the offset; rows that shift during the walk are read once)."+
			"\n"+serviceHelp)
	var sf serviceFlags
	sf.register(fs)
	var (
		callID = fs.String("call-id", "", "only the deliveries of the call `id`")
		since  = fs.Duration("since", 0, "only deliveries created within this window, e.g. 2h (default: all)")
		asJSON = fs.Bool("json", false, "print {count, results} as JSON")
	)
	if ok, code := parseFlags(fs, args, stdio); !ok {
		return code
	}
	if len(fs.args) > 0 {
		return usageError(stdio, name, "unexpected argument %q", fs.args[0])
	}
	if *since < 0 {
		return usageError(stdio, name, "--since must be positive")
	}
	c, err := sf.client(stdio, name)
	if err != nil {
		return serviceFail(stdio, name, err)
	}
	f := service.Filter{CallID: *callID}
	if *since > 0 {
		f.Since = time.Now().Add(-*since)
	}
	status := newStatusLine(stdio.Err)
	ds, err := c.Deliveries(ctx, f, func(p service.Progress) {
		status.show(fmt.Sprintf("%d pages, %d of %d deliveries", p.Pages, p.Seen, p.Count), false)
	})
	status.done()
	if err != nil {
		return serviceFail(stdio, name, err)
	}
	if ds == nil {
		ds = []service.Delivery{}
	}
	if *asJSON {
		json.NewEncoder(stdio.Out).Encode(struct {
			Count   int                `json:"count"`
			Results []service.Delivery `json:"results"`
		}{len(ds), ds})
		return 0
	}
	service.WriteDeliveries(stdio.Out, ds)
	return 0
}

func cmdServiceDelivery(ctx context.Context, args []string, stdio Stdio) int {
	const name = "service delivery"
	fs := newFlagSet(name, "calltap service delivery ID [--payload | --json]",
		"Show one delivery from the service's log: what was sent where, and what the target answered.\n"+serviceHelp)
	var sf serviceFlags
	sf.register(fs)
	var (
		payload = fs.Bool("payload", false, "print only the payload, the exact bytes that were sent")
		asJSON  = fs.Bool("json", false, "print the delivery record as JSON")
	)
	if ok, code := parseFlags(fs, args, stdio); !ok {
		return code
	}
	if len(fs.args) != 1 {
		return usageError(stdio, name, "give one delivery ID")
	}
	if *payload && *asJSON {
		return usageError(stdio, name, "--payload and --json do not go together")
	}
	c, err := sf.client(stdio, name)
	if err != nil {
		return serviceFail(stdio, name, err)
	}
	d, err := c.Delivery(ctx, fs.args[0])
	if err != nil {
		return serviceFail(stdio, name, err)
	}
	switch {
	case *payload:
		stdio.Out.Write(d.Payload)
		if n := len(d.Payload); n > 0 && d.Payload[n-1] != '\n' && isTerminal(stdio.Out) {
			fmt.Fprintln(stdio.Out)
		}
	case *asJSON:
		json.NewEncoder(stdio.Out).Encode(d)
	default:
		service.WriteDelivery(stdio.Out, d)
	}
	return 0
}

func cmdServiceReplay(ctx context.Context, args []string, stdio Stdio) int {
	const name = "service replay"
	fs := newFlagSet(name, "calltap service replay ID [--json]",
		"Ask the service to re-send a delivery: the original payload, unchanged, with a fresh retry budget.\nUse it once the handler is fixed. (calltap replay re-sends a local capture instead.)\n"+serviceHelp)
	var sf serviceFlags
	sf.register(fs)
	asJSON := fs.Bool("json", false, "print the replay result {id, status, queued} as JSON")
	if ok, code := parseFlags(fs, args, stdio); !ok {
		return code
	}
	if len(fs.args) != 1 {
		return usageError(stdio, name, "give one delivery ID")
	}
	c, err := sf.client(stdio, name)
	if err != nil {
		return serviceFail(stdio, name, err)
	}
	r, err := c.Replay(ctx, fs.args[0])
	if err != nil {
		return serviceFail(stdio, name, err)
	}
	if *asJSON {
		json.NewEncoder(stdio.Out).Encode(r)
		return 0
	}
	queued := "not queued"
	if r.Queued {
		queued = "queued"
	}
	fmt.Fprintf(stdio.Out, "replay of delivery %s %s (status %s)\n", r.ID, queued, orDash(r.Status))
	return 0
}
