package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/calltap/calltap/inspector/voice/callevent"
	"github.com/calltap/calltap/inspector/voice/trigger"
	"github.com/calltap/calltap/storage"
	"github.com/calltap/calltap/storage/agentdb"
)

func cmdTrigger(ctx context.Context, args []string, stdio Stdio) int {
	fs := newFlagSet("trigger", "calltap trigger (KIND | --flow completed|failed) --to URL [flags]",
		"Send realistic voice-call events to URL (the tunnel URL, or a local handler) as the service would.\n"+
			"KIND is one of "+strings.Join(callevent.Kinds, ", ")+".\n"+
			"--flow completed sends started, connected, ended, recording_available, analysis_completed;\n"+
			"--flow failed sends started, failed. Events of one run share a call and consistent times.\n"+
			"Exits 1 when any delivery got no 2xx.")
	var (
		to          = fs.String("to", "", "`url` to POST the events to (required)")
		flow        = fs.String("flow", "", "send a whole call of this `outcome`: completed or failed")
		outcomeCode = fs.String("outcome-code", "", "`code`: outcome_code of call.failed: busy, no_answer or dispatch_error (default busy)")
		callID      = fs.String("call-id", "", "call `id` to use (default: a new UUID), to send more events of one call")
		contactFile = fs.String("contact-file", "", "JSON `file` with the call's contact object (id, name, phone, email, custom_fields)")
		mediaBase   = fs.String("media-base-url", "", "base `url` of the recording and transcript links (default "+callevent.DefaultMediaBaseURL+")")
		duplicate   = fs.Bool("duplicate", false, "deliver each event twice, as the service's retries do")
		asJSON      = fs.Bool("json", false, "print what was sent and what came back as JSON")
		dataDir     = fs.String("data", defaultDataDir(), "data `dir`ectory of the agent behind --to, where the capture ids are looked up")
		sets        stringList
		headers     stringList
	)
	fs.Var(&sets, "set", "edit the payloads: `path=value`, e.g. call.variables.lead_id=EZ-1 (repeatable; value is JSON if it parses)")
	fs.Var(&headers, "header", "`'Name: value'` sent with every event, as event_webhook_headers would be (repeatable)")
	fs.require("to")
	if ok, code := parseFlags(fs, args, stdio); !ok {
		return code
	}
	if len(fs.args) > 1 {
		return usageError(stdio, "trigger", "one event kind at most, got %q", strings.Join(fs.args, " "))
	}
	o := trigger.Options{URL: *to, Flow: *flow, OutcomeCode: *outcomeCode, Set: sets, Duplicate: *duplicate}
	if len(fs.args) == 1 {
		o.Kind = fs.args[0]
	}
	for _, h := range headers {
		f, err := trigger.ParseHeader(h)
		if err != nil {
			return usageError(stdio, "trigger", "%s", strings.TrimPrefix(err.Error(), "trigger: "))
		}
		o.Header = append(o.Header, f)
	}
	o.Spec.CallID, o.Spec.MediaBaseURL = *callID, *mediaBase
	if *contactFile != "" {
		c, err := readContact(*contactFile)
		if err != nil {
			return fail(stdio, "trigger", err)
		}
		o.Spec.Contact = c
	}

	res, err := trigger.Run(ctx, o)
	if errors.Is(err, trigger.ErrOptions) {
		return usageError(stdio, "trigger", "%s", strings.TrimPrefix(err.Error(), "trigger: "))
	}
	if err != nil {
		return fail(stdio, "trigger", err)
	}
	findCaptures(ctx, *dataDir, &res)
	if *asJSON {
		enc := json.NewEncoder(stdio.Out)
		enc.SetIndent("", "  ")
		enc.Encode(res)
	} else {
		printDeliveries(stdio.Out, o.URL, res)
	}
	if n := res.Failed(); n > 0 {
		fmt.Fprintf(stdio.Err, "calltap trigger: %d of %d deliveries got no 2xx\n", n, len(res.Deliveries))
		return 1
	}
	return 0
}

// readContact reads a contact object, keeping fields it does not know.
func readContact(path string) (callevent.Contact, error) {
	f, err := os.Open(path)
	if err != nil {
		return callevent.Contact{}, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 1<<20+1))
	if err != nil {
		return callevent.Contact{}, err
	}
	if len(b) > 1<<20 {
		return callevent.Contact{}, fmt.Errorf("%s: larger than 1 MiB", path)
	}
	var c callevent.Contact
	if err := json.Unmarshal(b, &c); err != nil {
		return callevent.Contact{}, fmt.Errorf("%s: want a JSON object with the contact's fields: %v", path, err)
	}
	return c, nil
}

func printDeliveries(w io.Writer, url string, res trigger.Result) {
	fmt.Fprintf(w, "call %s -> %s\n", res.CallID, url)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "EVENT\tDELIVERY ID\tCAPTURE ID\tSTATUS\tDURATION\tNOTE")
	for _, d := range res.Deliveries {
		status := "-"
		if d.Status > 0 {
			status = fmt.Sprint(d.Status)
		}
		note := d.Error
		if d.Copy > 1 {
			note = strings.TrimSpace("duplicate " + note)
		}
		capture := d.CaptureID
		if capture == "" {
			capture = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.1f ms\t%s\n", d.Event, d.DeliveryID, capture, status, d.DurationMS, note)
	}
	tw.Flush()
}

// captureWait bounds how long trigger looks for the captures of accepted
// deliveries: an agent records a capture just after its answer, and a
// target that is not this store's agent leaves them missing for good.
const captureWait = 500 * time.Millisecond

// findCaptures sets the CaptureID of every accepted delivery whose capture
// is in the store in dataDir, so that what trigger prints can be pasted
// into replay, keep or delete. The Nth copy of a delivery (--duplicate) is
// the Nth capture of its delivery id, replays aside. No store, no ids.
func findCaptures(ctx context.Context, dataDir string, res *trigger.Result) {
	// Read-only, and quiet: a column of ids is not worth a line about what
	// the store lacks.
	db, _, err := readAgentDB(ctx, Stdio{Err: io.Discard}, "trigger", dataDir, false)
	if err != nil || db == nil {
		return
	}
	defer db.Close()
	deadline := time.Now().Add(captureWait)
	for {
		missing := 0
		for i := range res.Deliveries {
			d := &res.Deliveries[i]
			if d.CaptureID != "" || !d.OK() {
				continue
			}
			if d.CaptureID = nthCapture(ctx, db, d.DeliveryID, d.Copy); d.CaptureID == "" {
				missing++
			}
		}
		if missing == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// nthCapture is the id of the nth (from 1) capture of a delivery, oldest
// first and replays aside; "" when there is none.
func nthCapture(ctx context.Context, db *agentdb.AgentStore, deliveryID string, n int) string {
	cs, _, err := db.Captures(ctx, agentdb.CaptureFilter{DeliveryID: deliveryID, Page: storage.Page{Limit: 20}})
	if err != nil {
		return ""
	}
	slices.Reverse(cs)
	for _, c := range cs {
		if c.ReplayOf != "" {
			continue
		}
		if n--; n <= 0 {
			return c.ID
		}
	}
	return ""
}
