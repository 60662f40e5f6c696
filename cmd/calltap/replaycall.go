package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/calltap/calltap/inspector"
	"github.com/calltap/calltap/inspector/agent"
	"github.com/calltap/calltap/relay/api"
	"github.com/calltap/calltap/relay/wire"
	"github.com/calltap/calltap/storage/agentdb"
)

// callReplay is `calltap replay --call ID` or `--from FILE`: a whole call
// (or a whole export) re-fired in its original order and spacing, each
// request stored as a replay of its original, each answer checked against
// what --expect says.
type callReplay struct {
	callID     string
	from       string // an export to replay instead of the store's captures
	to         string
	timeScale  float64
	retries    bool     // replay the service's retries of a delivery too
	expect     string   // "2xx", "200", …; "" checks nothing
	expectJSON []string // path=value checks of the answer's JSON body
	headers    []string // "Name: value" set on every request, replacing the captured values
	asJSON     bool
}

func (r *callReplay) validate() error {
	if err := r.expectation().Validate(); err != nil {
		return err
	}
	if r.timeScale < 0 || math.IsNaN(r.timeScale) || math.IsInf(r.timeScale, 0) {
		return fmt.Errorf("--time-scale must be a number, 0 or more")
	}
	_, err := replayHeaders(r.headers)
	return err
}

// replayHeaders reads --header values, "Name: value" each.
func replayHeaders(hs []string) (wire.Header, error) {
	var out wire.Header
	for _, h := range hs {
		name, value, ok := strings.Cut(h, ":")
		name, value = strings.TrimSpace(name), strings.TrimSpace(value)
		if !ok || name == "" || strings.ContainsAny(name, " \t") || strings.ContainsAny(value, "\r\n\x00") {
			return nil, fmt.Errorf("--header %q: want 'Name: value'", h)
		}
		out = append(out, wire.HeaderField{Name: name, Value: value})
	}
	return out, nil
}

// run replays the selection through an agent over db and reports; the
// exit status is 1 when anything did not match.
func (r *callReplay) run(ctx context.Context, stdio Stdio, db *agentdb.AgentStore) int {
	a, stop, err := startAgent(ctx, agent.Config{Store: db})
	if err != nil {
		return fail(stdio, "replay", err)
	}
	defer stop()
	set, _ := replayHeaders(r.headers)
	o := agent.CallReplayOptions{CallID: r.callID, To: r.to, TimeScale: r.timeScale, WithRetries: r.retries, SetHeaders: set}
	originals, err := a.CallOriginals(ctx, o)
	if err != nil {
		return fail(stdio, "replay", apiMessage(err))
	}
	var results []inspector.CallReplayResult
	failed := 0
	err = a.ReplayCall(ctx, originals, o, func(orig, c *agentdb.Capture) {
		res := r.expectation().Check(orig, c)
		if len(res.Failures) > 0 {
			failed++
		}
		results = append(results, res)
	})
	if err != nil {
		return fail(stdio, "replay", apiMessage(err))
	}
	if r.asJSON {
		json.NewEncoder(stdio.Out).Encode(map[string]any{"replayed": len(results), "failed": failed, "results": results})
	} else {
		printCallReplay(stdio.Out, results, failed)
	}
	if failed > 0 {
		return 1
	}
	return 0
}

// startAgent runs an agent of cfg, without a tunnel, for replays and
// backfills; stop ends it and waits.
func startAgent(ctx context.Context, cfg agent.Config) (a *agent.Agent, stop func(), err error) {
	a, err = agent.New(cfg)
	if err != nil {
		return nil, nil, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { a.Run(runCtx); close(done) }()
	return a, func() { cancel(); <-done }, nil
}

// expectation is what --expect and --expect-body-json ask of each answer.
func (r *callReplay) expectation() inspector.Expect {
	return inspector.Expect{Status: r.expect, JSON: r.expectJSON}
}

func printCallReplay(w io.Writer, results []inspector.CallReplayResult, failed int) {
	for _, res := range results {
		mark := "ok  "
		if len(res.Failures) > 0 {
			mark = "FAIL"
		}
		fmt.Fprintf(w, "%s %-26s %s → %d", mark, res.Event, res.Original, res.Status)
		if len(res.Failures) > 0 {
			fmt.Fprintf(w, "  %s", strings.Join(res.Failures, "; "))
		} else if res.Error != "" {
			fmt.Fprintf(w, "  %s", res.Error)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "%d replayed, %d failed\n", len(results), failed)
}

// apiMessage is an API error's message alone, as a command prints it.
func apiMessage(err error) error {
	var e *api.Error
	if errors.As(err, &e) {
		return errors.New(e.Message)
	}
	return err
}
