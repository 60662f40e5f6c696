// Package trigger sends realistic voice-call events to a URL, the way the
// voice service delivers them (documentation section 6.3): one HTTP POST
// with a JSON body per event, plus the headers the service would have been
// given in event_webhook_headers. It serves `calltap trigger`, pointed at
// the tunnel's public URL or straight at a local handler.
package trigger

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/calltap/calltap/inspector/voice/callevent"
	"github.com/calltap/calltap/relay/wire"
)

// Options says what to send and where.
type Options struct {
	URL string // where to POST; required

	// Kind sends one event of this kind (one of the six); otherwise Flow
	// sends a whole call: callevent.FlowCompleted or callevent.FlowFailed.
	Kind string
	Flow string

	// Spec shapes the call (contact, variables, numbers, timing); its Flow
	// and OutcomeCode are taken from Options.
	Spec        callevent.CallSpec
	OutcomeCode string // for call.failed: busy, no_answer or dispatch_error

	// Set edits every payload that has the path's first member (every
	// payload when none has it): "call.variables.lead_id=EZ-1". The value
	// is JSON when it parses as JSON, else a string.
	Set []string

	Header    wire.Header // sent with every delivery, repeats kept
	Duplicate bool        // deliver each event twice, as the service's retries do

	Client      *http.Client  // default: one with Timeout
	Timeout     time.Duration // per request; default 30 s
	MaxResponse int64         // response bytes kept; default 1 MiB
}

// Delivery is one POST and what came back.
type Delivery struct {
	Event           string          `json:"event"`
	DeliveryID      string          `json:"delivery_id"`
	Copy            int             `json:"copy"` // 1, or 2 for the --duplicate copy
	URL             string          `json:"url"`
	RequestHeaders  wire.Header     `json:"request_headers"`
	Payload         json.RawMessage `json:"payload"`
	Status          int             `json:"status"` // 0 when no response came
	ResponseHeaders wire.Header     `json:"response_headers"`
	ResponseBody    string          `json:"response_body"`
	Truncated       bool            `json:"response_truncated,omitempty"`
	Error           string          `json:"error"`
	DurationMS      float64         `json:"duration_ms"`

	// CaptureID is the capture an agent made of it, when the caller
	// found one (calltap trigger looks in its data directory's store).
	CaptureID string `json:"capture_id,omitempty"`
}

// OK reports whether the target accepted the delivery: the service counts
// any 2xx as delivered (section 6.7).
func (d Delivery) OK() bool { return d.Error == "" && d.Status >= 200 && d.Status < 300 }

// Result is everything Run sent.
type Result struct {
	CallID     string     `json:"call_id"`
	Deliveries []Delivery `json:"deliveries"`
}

// Failed counts deliveries the service would retry or give up on.
func (r Result) Failed() int {
	n := 0
	for _, d := range r.Deliveries {
		if !d.OK() {
			n++
		}
	}
	return n
}

// Outgoing is one event ready to send.
type Outgoing struct {
	Event      string
	DeliveryID string
	Body       []byte
}

// ErrOptions wraps mistakes in Options, which the command reports as usage
// errors.
var ErrOptions = errors.New("trigger")

func optErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrOptions, fmt.Sprintf(format, args...))
}

// Build generates the bodies Run would send, in order, without sending them.
// It returns the call id too.
func Build(o Options) ([]Outgoing, string, error) {
	spec := o.Spec
	spec.OutcomeCode = o.OutcomeCode
	flow, err := flowOf(o)
	if err != nil {
		return nil, "", err
	}
	spec.Flow = flow
	payloads := spec.Events()
	if o.Kind != "" {
		payloads = onlyKind(payloads, o.Kind)
	}
	callID := payloads[0].Call.CallID
	edits, err := parseSets(o.Set)
	if err != nil {
		return nil, "", err
	}
	maps, err := editedMaps(payloads, edits)
	if err != nil {
		return nil, "", err
	}
	out := make([]Outgoing, len(payloads))
	for i, p := range payloads {
		var v any = p // documented member order
		if len(edits) > 0 {
			v = maps[i]
		}
		body, err := json.Marshal(v)
		if err != nil {
			return nil, "", err
		}
		ix, _ := callevent.Index(body)
		out[i] = Outgoing{Event: ix.Event, DeliveryID: ix.DeliveryID, Body: body}
		if out[i].Event == "" {
			out[i].Event = p.Event
		}
	}
	return out, callID, nil
}

// flowOf is the call's flow that o asks for: an event kind's, or --flow.
func flowOf(o Options) (string, error) {
	var flow string
	switch {
	case o.Kind != "" && o.Flow != "":
		return "", optErr("give an event kind or a flow, not both")
	case o.Kind != "":
		if !callevent.IsKind(o.Kind) {
			return "", optErr("unknown event kind %q; one of %s", o.Kind, strings.Join(callevent.Kinds, ", "))
		}
		flow = callevent.FlowCompleted
		if o.Kind == callevent.KindFailed {
			flow = callevent.FlowFailed
		}
	case o.Flow == callevent.FlowCompleted || o.Flow == callevent.FlowFailed:
		flow = o.Flow
	case o.Flow == "":
		return "", optErr("give an event kind or --flow completed|failed")
	default:
		return "", optErr("unknown flow %q; completed or failed", o.Flow)
	}
	if o.OutcomeCode != "" && flow != callevent.FlowFailed {
		return "", optErr("--outcome-code applies to call.failed only")
	}
	return flow, nil
}

// onlyKind keeps the payload of one event kind, when the flow has it.
func onlyKind(payloads []callevent.Payload, kind string) []callevent.Payload {
	for _, p := range payloads {
		if p.Event == kind {
			return []callevent.Payload{p}
		}
	}
	return payloads
}

// edit is one --set: a dot path in the body and the value it gets.
type edit struct{ path, value string }

func parseSets(sets []string) ([]edit, error) {
	var edits []edit
	for _, kv := range sets {
		path, value, ok := strings.Cut(kv, "=")
		if !ok || path == "" {
			return nil, optErr("--set %q: want path=value, e.g. call.variables.lead_id=EZ-1", kv)
		}
		edits = append(edits, edit{path, value})
	}
	return edits, nil
}

// editedMaps returns the payloads as maps with the edits made. An edit
// whose top-level member some payloads have (analysis, media) goes to
// those only; one that none has goes to every payload.
func editedMaps(payloads []callevent.Payload, edits []edit) ([]map[string]any, error) {
	maps := make([]map[string]any, len(payloads))
	for i, p := range payloads {
		m, err := p.ToMap()
		if err != nil {
			return nil, err
		}
		maps[i] = m
	}
	for _, e := range edits {
		top, _, _ := strings.Cut(e.path, ".")
		anyHas := false
		for _, m := range maps {
			_, ok := m[top]
			anyHas = anyHas || ok
		}
		for _, m := range maps {
			if _, ok := m[top]; !ok && anyHas {
				continue
			}
			if err := callevent.SetPath(m, e.path, e.value); err != nil {
				return nil, optErr("--set %s: %v", e.path, err)
			}
		}
	}
	return maps, nil
}

// Run builds the events and POSTs them to o.URL one after another, each
// twice with Duplicate. A delivery that fails is recorded in the result,
// not returned as an error: the error is for bad options and a cancelled
// context.
func Run(ctx context.Context, o Options) (Result, error) {
	if o.URL == "" {
		return Result{}, optErr("--to URL is required")
	}
	if !strings.HasPrefix(o.URL, "http://") && !strings.HasPrefix(o.URL, "https://") {
		return Result{}, optErr("--to %q: want an http:// or https:// URL", o.URL)
	}
	if _, err := http.NewRequest(http.MethodPost, o.URL, nil); err != nil {
		return Result{}, optErr("--to %q: %v", o.URL, err)
	}
	events, callID, err := Build(o)
	if err != nil {
		return Result{}, err
	}
	if o.Timeout <= 0 {
		o.Timeout = 30 * time.Second
	}
	if o.MaxResponse <= 0 {
		o.MaxResponse = 1 << 20
	}
	client := o.Client
	if client == nil {
		client = &http.Client{Timeout: o.Timeout}
	}
	res := Result{CallID: callID, Deliveries: []Delivery{}}
	copies := 1
	if o.Duplicate {
		copies = 2
	}
	for _, ev := range events {
		for c := 1; c <= copies; c++ {
			if err := ctx.Err(); err != nil {
				return res, err
			}
			res.Deliveries = append(res.Deliveries, send(ctx, client, o, ev, c))
		}
	}
	return res, nil
}

func send(ctx context.Context, client *http.Client, o Options, ev Outgoing, copy int) Delivery {
	d := Delivery{Event: ev.Event, DeliveryID: ev.DeliveryID, Copy: copy, URL: o.URL, Payload: ev.Body,
		RequestHeaders: wire.Header{}, ResponseHeaders: wire.Header{}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, o.URL, bytes.NewReader(ev.Body))
	if err != nil {
		d.Error = err.Error()
		return d
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "calltap-trigger")
	for _, f := range o.Header {
		if http.CanonicalHeaderKey(f.Name) == "Content-Type" || http.CanonicalHeaderKey(f.Name) == "User-Agent" {
			req.Header.Del(f.Name)
		}
	}
	o.Header.Apply(req.Header)
	d.RequestHeaders = wire.HeaderFrom(req.Header, "")
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		d.DurationMS = ms(time.Since(start))
		d.Error = err.Error()
		return d
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, o.MaxResponse+1))
	d.DurationMS = ms(time.Since(start))
	d.Status = resp.StatusCode
	d.ResponseHeaders = wire.HeaderFrom(resp.Header, "")
	if int64(len(body)) > o.MaxResponse {
		body, d.Truncated = body[:o.MaxResponse], true
	}
	d.ResponseBody = string(body)
	if err != nil {
		d.Error = "reading the response: " + err.Error()
	}
	return d
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// ParseHeader reads a "Name: value" flag.
func ParseHeader(s string) (wire.HeaderField, error) {
	name, value, ok := strings.Cut(s, ":")
	name = strings.TrimSpace(name)
	if !ok || name == "" || strings.ContainsAny(name, " \t\r\n") || strings.ContainsAny(value, "\r\n") {
		return wire.HeaderField{}, optErr("--header %q: want 'Name: value'", s)
	}
	return wire.HeaderField{Name: name, Value: strings.TrimSpace(value)}, nil
}
