package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
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

// errConfig marks a missing or broken setting: a usage error.
var errConfig = errors.New("config")

type configError struct{ msg string }

func (e *configError) Error() string   { return e.msg }
func (e *configError) Is(t error) bool { return t == errConfig }

// client builds the service client from the flags, the environment and
// the config file. Warnings (a config file others can read) go to stdio.Err.
func (f *serviceFlags) client(stdio Stdio, cmd string) (*service.Client, error) {
	path, explicit := f.config, f.config != ""
	if !explicit {
		path = service.DefaultConfigPath()
	}
	file, err := service.ReadConfig(path)
	switch {
	case errors.Is(err, os.ErrNotExist) && !explicit:
		file = map[string]string{}
	case err != nil:
		return nil, &configError{err.Error()}
	}
	base := f.baseURL
	if base == "" {
		base = os.Getenv("CALLTAP_BASE_URL")
	}
	if base == "" {
		base = file["base_url"]
	}
	if base == "" {
		return nil, &configError{"no base URL: give --base-url, set CALLTAP_BASE_URL or base_url in " + path}
	}
	key := os.Getenv("CALLTAP_API_KEY")
	if key == "" {
		key = file["api_key"]
		if key != "" {
			if st, err := os.Stat(path); err == nil && st.Mode().Perm()&0o077 != 0 {
				fmt.Fprintf(stdio.Err, "calltap %s: warning: %s holds an API key and others can read it; chmod 600 it\n", cmd, path)
			}
		}
	}
	if key == "" {
		return nil, &configError{"no API key: set CALLTAP_API_KEY or api_key in " + path}
	}
	c, err := service.New(base, key, service.WithUserAgent("calltap/"+version))
	if err != nil {
		return nil, &configError{err.Error()}
	}
	return c, nil
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
	if errors.Is(err, errConfig) {
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
	tw := tabwriter.NewWriter(stdio.Out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tCREATED\tEVENT\tCALL\tSTATUS\tATTEMPTS\tRESPONSE")
	for _, d := range ds {
		created := "-"
		if !d.CreatedAt.IsZero() {
			created = d.CreatedAt.Local().Format(time.DateTime)
		}
		resp := "-"
		if d.ResponseStatus != nil {
			resp = fmt.Sprint(*d.ResponseStatus)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d/%d\t%s\n", d.ID, created, orDash(d.Event), orDash(d.CallID), orDash(d.Status), d.Attempts, d.MaxAttempts, resp)
	}
	tw.Flush()
	fmt.Fprintf(stdio.Out, "%d deliveries\n", len(ds))
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
		printDelivery(stdio.Out, d)
	}
	return 0
}

// printDelivery writes a delivery record for a person, its payload aside.
func printDelivery(w io.Writer, d *service.Delivery) {
	resp := "no answer"
	if d.ResponseStatus != nil {
		resp = fmt.Sprint(*d.ResponseStatus)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "id\t%s\nevent\t%s\ncall\t%s\nurl\t%s\nstatus\t%s after %d of %d attempts\nresponse\t%s\n",
		d.ID, orDash(d.Event), orDash(d.CallID), d.URL, orDash(d.Status), d.Attempts, d.MaxAttempts, resp)
	if d.Error != "" {
		fmt.Fprintf(tw, "error\t%s\n", d.Error)
	}
	for _, a := range d.AttemptLog {
		st := "-"
		if a.ResponseStatus != nil {
			st = fmt.Sprint(*a.ResponseStatus)
		}
		fmt.Fprintf(tw, "attempt %d\t%s  %s  %s\n", a.N, a.At.Local().Format("2006-01-02 15:04:05.000"), st, a.Error)
	}
	fmt.Fprintf(tw, "payload\t%d bytes (--payload prints them)\n", len(d.Payload))
	tw.Flush()
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
