package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
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

// callReplayResult is one replayed request, as --json prints it.
type callReplayResult struct {
	Original string   `json:"original_id"`
	ID       string   `json:"id"`
	Event    string   `json:"event"`
	Status   int      `json:"response_status"`
	Error    string   `json:"error,omitempty"`
	Failures []string `json:"failures"` // what did not match --expect
}

func (r *callReplay) validate() error {
	if r.expect != "" {
		if _, _, err := statusRange(r.expect); err != nil {
			return err
		}
	}
	for _, e := range r.expectJSON {
		if p, _, ok := strings.Cut(e, "="); !ok || p == "" {
			return fmt.Errorf("--expect-body-json %q: want path=value", e)
		}
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

// statusRange reads --expect: a class such as 2xx, or one status.
func statusRange(s string) (int, int, error) {
	if len(s) == 3 && strings.HasSuffix(s, "xx") && s[0] >= '1' && s[0] <= '5' {
		base := int(s[0]-'0') * 100
		return base, base + 99, nil
	}
	if n, err := strconv.Atoi(s); err == nil && n >= 100 && n <= 599 {
		return n, n, nil
	}
	return 0, 0, fmt.Errorf("--expect %q: want a status class such as 2xx or a status such as 200", s)
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
	var results []callReplayResult
	failed := 0
	err = a.ReplayCall(ctx, originals, o, func(orig, c *agentdb.Capture) {
		res := r.check(orig, c)
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

// check holds the replay c of orig against --expect and --expect-body-json.
func (r *callReplay) check(orig, c *agentdb.Capture) callReplayResult {
	res := callReplayResult{Original: orig.ID, ID: c.ID, Event: orig.Event, Status: c.ResponseStatus, Error: c.Error, Failures: []string{}}
	if res.Event == "" {
		res.Event = orig.Method + " " + orig.Path
	}
	if r.expect != "" {
		if lo, hi, _ := statusRange(r.expect); c.ResponseStatus < lo || c.ResponseStatus > hi {
			got := "got no answer"
			if c.Error != "" {
				got += " (" + c.Error + ")"
			}
			if c.ResponseStatus > 0 {
				got = "answered " + strconv.Itoa(c.ResponseStatus)
			}
			res.Failures = append(res.Failures, fmt.Sprintf("%s, want %s", got, r.expect))
		}
	}
	for _, e := range r.expectJSON {
		if msg := checkBodyJSON(c.ResponseBody, e); msg != "" {
			res.Failures = append(res.Failures, msg)
		}
	}
	return res
}

func printCallReplay(w io.Writer, results []callReplayResult, failed int) {
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

// checkBodyJSON checks one path=value of --expect-body-json against an
// answer's JSON body; "" when it holds. A value is compared as JSON when it
// parses as JSON (true, 3, "x"), else as a string.
func checkBodyJSON(body []byte, expr string) string {
	path, want, _ := strings.Cut(expr, "=")
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		return fmt.Sprintf("the answer is not JSON, want %s", expr)
	}
	for _, key := range strings.Split(path, ".") {
		obj, ok := v.(map[string]any)
		if !ok {
			return fmt.Sprintf("the answer has no %s", path)
		}
		if v, ok = obj[key]; !ok {
			return fmt.Sprintf("the answer has no %s", path)
		}
	}
	var wantV any
	if json.Unmarshal([]byte(want), &wantV) != nil {
		wantV = want
	}
	gotJSON, _ := json.Marshal(v)
	wantJSON, _ := json.Marshal(wantV)
	if string(gotJSON) != string(wantJSON) {
		return fmt.Sprintf("%s is %s, want %s", path, gotJSON, wantJSON)
	}
	return ""
}

// loadExport reads an export into a throwaway store in dir, so that a call
// replays from a file exactly as from the store. It returns the headers
// the export masked.
func loadExport(ctx context.Context, file, dir string) (*agentdb.AgentStore, []string, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	ef, err := inspector.ReadExport(f)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", file, err)
	}
	db, err := agentDB(ctx, dir)
	if err != nil {
		return nil, nil, err
	}
	if _, err := inspector.Import(ctx, db, ef.Captures); err != nil {
		db.Close()
		return nil, nil, err
	}
	return db, ef.Header.MaskedHeaders, nil
}

// unsupplied is the masked headers of an export that the captures hold
// (as MaskedValue) and --header does not give again.
func unsupplied(ctx context.Context, db *agentdb.AgentStore, masked []string, given wire.Header) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	_, err := db.EachCapture(ctx, agentdb.CaptureFilter{}, func(c *agentdb.Capture) error {
		var h wire.Header
		if h.UnmarshalJSON([]byte(c.RequestHeaders)) != nil {
			return nil
		}
		for _, f := range h {
			if f.Value != inspector.MaskedValue || given.Get(f.Name) != "" || seen[strings.ToLower(f.Name)] {
				continue
			}
			for _, m := range masked {
				if strings.EqualFold(m, f.Name) {
					seen[strings.ToLower(f.Name)] = true
					out = append(out, f.Name)
				}
			}
		}
		return nil
	})
	return out, err
}
