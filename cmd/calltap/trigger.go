package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/calltap/calltap/inspector"
	"github.com/calltap/calltap/inspector/voice/callevent"
	"github.com/calltap/calltap/inspector/voice/trigger"
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
		c, err := callevent.ReadContactFile(*contactFile)
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
		res.WriteTable(stdio.Out, o.URL)
	}
	if n := res.Failed(); n > 0 {
		fmt.Fprintf(stdio.Err, "calltap trigger: %d of %d deliveries got no 2xx\n", n, len(res.Deliveries))
		return 1
	}
	return 0
}

// captureWait bounds how long trigger looks for the captures of accepted
// deliveries: an agent records a capture just after its answer, and a
// target that is not this store's agent leaves them missing for good.
const captureWait = 500 * time.Millisecond

// findCaptures sets the capture ids of res's deliveries from the store in
// dataDir (inspector.FindTriggerCaptures), so that what trigger prints
// can be pasted into replay, keep or delete. No store, no ids.
func findCaptures(ctx context.Context, dataDir string, res *trigger.Result) {
	// Read-only, and quiet: a column of ids is not worth a line about what
	// the store lacks.
	db, _, err := readAgentDB(ctx, Stdio{Err: io.Discard}, "trigger", dataDir, false)
	if err != nil || db == nil {
		return
	}
	defer db.Close()
	inspector.FindTriggerCaptures(ctx, db, res, captureWait)
}
