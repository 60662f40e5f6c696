package emulator

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/calltap/calltap/inspector/voice/callevent"
	"github.com/calltap/calltap/relay/api"
	"github.com/calltap/calltap/storage/servicedb"
)

// Scenarios a dispatch can ask the emulator to play.
const (
	ScenarioCompleted     = "completed"
	ScenarioBusy          = "failed:busy"
	ScenarioNoAnswer      = "failed:no_answer"
	ScenarioDispatchError = "failed:dispatch_error"
)

// maxDispatchBody bounds a dispatch request.
const maxDispatchBody = 64 << 10

// dispatchRequest is the body of POST /calls/dispatch/: the documented
// dispatch parameters (4.8) and the emulator's own scenario and timings.
type dispatchRequest struct {
	ToNumber            string          `json:"to_number"`
	FromNumber          string          `json:"from_number"`
	EventWebhookURL     string          `json:"event_webhook_url"`
	EventWebhookHeaders json.RawMessage `json:"event_webhook_headers"`
	EventWebhookEvents  *[]string       `json:"event_webhook_events"` // nil: omitted, all six
	Variables           map[string]any  `json:"variables"`
	Contact             *contactInput   `json:"contact"`
	CampaignID          string          `json:"campaign_id"`
	Agent               *struct {
		ID   string `json:"id"`
		Name string `json:"name"`
	} `json:"agent"`
	Scenario string   `json:"scenario"`
	Timings  *timings `json:"timings"`
}

type contactInput struct {
	ID           string         `json:"id"`
	Name         string         `json:"name"`
	Phone        string         `json:"phone"`
	Email        string         `json:"email"`
	CustomFields map[string]any `json:"custom_fields"`
}

// timings are the lengths of a call's phases in seconds, before scaling;
// zero means callevent's default.
type timings struct {
	RingSeconds           float64 `json:"ring_seconds"`
	TalkSeconds           float64 `json:"talk_seconds"`
	RecordingAfterSeconds float64 `json:"recording_after_seconds"`
	AnalysisAfterSeconds  float64 `json:"analysis_after_seconds"`
}

// dispatchResult is the data of a dispatch response.
type dispatchResult struct {
	CallID    string   `json:"call_id"`
	Status    string   `json:"status"`
	Scenario  string   `json:"scenario"`
	ContactID string   `json:"contact_id"`
	Events    []string `json:"events"` // the kinds that will be delivered, in order
}

func (s *Server) dispatch(w http.ResponseWriter, r *http.Request) {
	var req dispatchRequest
	if err := api.DecodeJSON(w, r, maxDispatchBody, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	plan, err := s.validateDispatch(&req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	ctx := r.Context()
	contact, err := s.dispatchContact(r, &req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	call, deliveries, err := s.planCall(&req, plan, contact, s.baseURL(r))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if err := s.db.CreateCall(ctx, call, contact, deliveries, nil); err != nil {
		s.fail(w, r, err)
		return
	}
	s.nudge()
	res := dispatchResult{CallID: call.ID, Status: "queued", Scenario: call.Scenario, ContactID: contact.ID, Events: []string{}}
	for _, d := range deliveries {
		res.Events = append(res.Events, d.Event)
	}
	api.WriteData(w, http.StatusCreated, "call queued", res)
}

// dispatchPlan is what validation made of a request.
type dispatchPlan struct {
	headers [][2]string
	events  map[string]bool // nil: all
	flow    string
	outcome string
}

// validateDispatch checks a dispatch request as the documentation's 4.8
// describes it, and makes its plan: the delivery headers, the events
// subscribed to and the scenario's flow.
func (s *Server) validateDispatch(req *dispatchRequest) (*dispatchPlan, error) {
	p := &dispatchPlan{}
	if err := s.checkTarget(req); err != nil {
		return nil, err
	}
	var err error
	if p.headers, err = parseHeaderObject(req.EventWebhookHeaders); err != nil {
		return nil, err
	}
	if p.events, err = subscribedEvents(req.EventWebhookEvents); err != nil {
		return nil, err
	}
	if err := planScenario(req, p); err != nil {
		return nil, err
	}
	for _, check := range []func(*dispatchRequest) error{checkTimings, checkIDs, checkContact} {
		if err := check(req); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// checkTarget checks the numbers and the webhook URL.
func (s *Server) checkTarget(req *dispatchRequest) error {
	if !callevent.IsPhoneNumber(req.ToNumber) {
		return api.Invalid("to_number must be a phone number with a leading + and the country code, e.g. +12025550143; got %q", req.ToNumber)
	}
	if req.FromNumber != "" && !callevent.IsPhoneNumber(req.FromNumber) {
		return api.Invalid("from_number must be a phone number with a leading + and the country code; got %q", req.FromNumber)
	}
	if req.EventWebhookURL != "" {
		return s.checkWebhookURL(req.EventWebhookURL)
	}
	return nil
}

// subscribedEvents reads event_webhook_events; nil (omitted) means all six.
func subscribedEvents(list *[]string) (map[string]bool, error) {
	if list == nil {
		return nil, nil
	}
	events := map[string]bool{}
	for _, e := range *list {
		if !callevent.IsKind(e) {
			return nil, api.Invalid("event_webhook_events: %q is not an event kind (%s)", e, strings.Join(callevent.Kinds, ", "))
		}
		events[e] = true
	}
	return events, nil
}

// planScenario sets the flow and the outcome code of the scenario asked
// for (completed when none is).
func planScenario(req *dispatchRequest, p *dispatchPlan) error {
	switch req.Scenario {
	case "", ScenarioCompleted:
		req.Scenario, p.flow = ScenarioCompleted, callevent.FlowCompleted
	case ScenarioBusy, ScenarioNoAnswer, ScenarioDispatchError:
		p.flow, p.outcome = callevent.FlowFailed, strings.TrimPrefix(req.Scenario, "failed:")
	default:
		return api.Invalid("scenario must be one of %s, %s, %s, %s; got %q", ScenarioCompleted, ScenarioBusy, ScenarioNoAnswer, ScenarioDispatchError, req.Scenario)
	}
	return nil
}

func checkTimings(req *dispatchRequest) error {
	t := req.Timings
	if t == nil {
		return nil
	}
	for _, v := range []struct {
		name  string
		value float64
	}{{"ring_seconds", t.RingSeconds}, {"talk_seconds", t.TalkSeconds},
		{"recording_after_seconds", t.RecordingAfterSeconds}, {"analysis_after_seconds", t.AnalysisAfterSeconds}} {
		if v.value < 0 || v.value > 86400 {
			return api.Invalid("timings.%s must be between 0 and 86400 seconds", v.name)
		}
	}
	return nil
}

// checkIDs checks that the campaign's and the agent's ids, when given, are
// UUIDs.
func checkIDs(req *dispatchRequest) error {
	if req.CampaignID != "" {
		if _, err := uuid.Parse(req.CampaignID); err != nil {
			return api.Invalid("campaign_id must be a UUID")
		}
	}
	if req.Agent != nil && req.Agent.ID != "" {
		if _, err := uuid.Parse(req.Agent.ID); err != nil {
			return api.Invalid("agent.id must be a UUID")
		}
	}
	return nil
}

func checkContact(req *dispatchRequest) error {
	c := req.Contact
	if c == nil {
		return nil
	}
	if c.ID != "" {
		if _, err := uuid.Parse(c.ID); err != nil {
			return api.Invalid("contact.id must be a UUID")
		}
	}
	if c.Phone != "" && !callevent.IsPhoneNumber(c.Phone) {
		return api.Invalid("contact.phone must be a phone number with a leading + and the country code")
	}
	return nil
}

// checkWebhookURL applies section 6.10: https only; http (and every other
// scheme) is refused at dispatch. AllowHTTPWebhooks admits http to a
// loopback host, for tests and a handler on the same machine.
func (s *Server) checkWebhookURL(raw string) error {
	if len(raw) > 2048 {
		return api.Invalid("event_webhook_url is longer than 2048 characters")
	}
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || u.Hostname() == "" {
		return api.Invalid("event_webhook_url must be an absolute https URL; got %q", raw)
	}
	switch strings.ToLower(u.Scheme) {
	case "https":
		return nil
	case "http":
		if !s.cfg.AllowHTTPWebhooks {
			return api.Invalid("event_webhook_url must use https; http is refused (start mock-service with --allow-http-webhooks to admit http to loopback)")
		}
		if !isLoopback(u.Hostname()) {
			return api.Invalid("event_webhook_url: http is admitted for loopback hosts only; %q is not one", u.Hostname())
		}
		return nil
	default:
		return api.Invalid("event_webhook_url must use https; scheme %q is refused", u.Scheme)
	}
}

func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// reservedHeader reports a header a webhook cannot configure: it describes
// the connection or the body, which the emulator sets.
func reservedHeader(name string) bool {
	return http.CanonicalHeaderKey(name) == "Host" || api.ConnectionHeader(name)
}

// parseHeaderObject reads event_webhook_headers, an object of header name to
// string, in order. A repeated name is refused rather than one copy being
// silently dropped.
func parseHeaderObject(raw json.RawMessage) ([][2]string, error) {
	if len(bytes.TrimSpace(raw)) == 0 || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		return nil, nil
	}
	bad := func(format string, args ...any) error {
		return api.Invalid("event_webhook_headers: "+format, args...)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, bad("must be an object of header name to string")
	}
	var out [][2]string
	seen := map[string]bool{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, bad("must be an object of header name to string")
		}
		name := t.(string)
		var value any
		if err := dec.Decode(&value); err != nil {
			return nil, bad("must be an object of header name to string")
		}
		v, ok := value.(string)
		if !ok {
			return nil, bad("the value of %q must be a string", name)
		}
		if !validHeaderName(name) {
			return nil, bad("%q is not a valid header name", name)
		}
		if strings.ContainsAny(v, "\r\n\x00") {
			return nil, bad("the value of %q holds a line break", name)
		}
		canon := http.CanonicalHeaderKey(name)
		if reservedHeader(canon) {
			return nil, bad("%s is set by the service and cannot be configured", canon)
		}
		if seen[canon] {
			return nil, bad("%s is given twice", canon)
		}
		seen[canon] = true
		out = append(out, [2]string{name, v})
	}
	if len(out) > 50 {
		return nil, bad("at most 50 headers")
	}
	return out, nil
}

func validHeaderName(name string) bool {
	if name == "" || len(name) > 256 {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0 {
			continue
		}
		return false
	}
	return true
}

// dispatchContact finds or creates the contact a call is for: the one
// given, merged over the stored contact with its id (fields given win;
// custom fields are merged), else the first contact with the number
// called, else a new one. Missing names and emails are made up, so that the
// payloads and the contacts collection agree.
func (s *Server) dispatchContact(r *http.Request, req *dispatchRequest) (*servicedb.Contact, error) {
	ctx := r.Context()
	c := req.Contact
	if c == nil {
		found, err := s.db.ContactByPhone(ctx, req.ToNumber)
		if err == nil {
			return found, nil
		} else if !errors.Is(err, servicedb.ErrNotFound) {
			return nil, err
		}
		c = &contactInput{}
	}
	sc := &servicedb.Contact{ID: c.ID, CreatedAt: s.now(), CustomFields: "{}"}
	if sc.ID == "" {
		sc.ID = uuid.NewString()
	} else if stored, err := s.db.ContactByID(ctx, sc.ID); err == nil {
		sc = stored
	} else if !errors.Is(err, servicedb.ErrNotFound) {
		return nil, err
	}
	for _, f := range []struct {
		dst *string
		v   string
	}{{&sc.Name, c.Name}, {&sc.Phone, c.Phone}, {&sc.Email, c.Email}} {
		if f.v != "" {
			*f.dst = f.v
		}
	}
	if sc.Phone == "" {
		sc.Phone = req.ToNumber
	}
	if sc.Name == "" {
		sc.Name = randomName(nil)
	}
	if sc.Email == "" {
		sc.Email = emailOf(sc.Name)
	}
	cf := map[string]any{}
	json.Unmarshal([]byte(sc.CustomFields), &cf)
	for k, v := range c.CustomFields {
		cf[k] = v
	}
	b, err := json.Marshal(cf)
	if err != nil {
		return nil, api.Invalid("contact.custom_fields: %v", err)
	}
	sc.CustomFields = string(b)
	return sc, nil
}

// planCall generates the call's events and the deliveries that will send
// them.
//
// The payloads keep the call's real lengths (a 94 s conversation says
// duration_seconds 94) while --time-scale shrinks the waits between them.
// So that no event claims to have occurred after the moment it is sent,
// a call under a scale below 1 is back-dated by (1 − scale) × its length:
// the last event occurs exactly when it is sent, the others a little before.
func (s *Server) planCall(req *dispatchRequest, p *dispatchPlan, contact *servicedb.Contact, base string) (*servicedb.Call, []*servicedb.Delivery, error) {
	now := s.now().Truncate(time.Microsecond)
	spec := callevent.CallSpec{
		CallID:     uuid.NewString(),
		From:       req.FromNumber,
		To:         req.ToNumber,
		CampaignID: req.CampaignID,
		Variables:  req.Variables,
		Flow:       p.flow,
		// OutcomeCode is callevent's spelling, the scenario without "failed:".
		OutcomeCode: p.outcome,
		ExpiresIn:   int(s.cfg.MediaExpiresIn / time.Second),
	}
	if spec.Variables == nil {
		spec.Variables = map[string]any{}
	}
	if req.Agent != nil {
		spec.Agent = callevent.Agent{ID: req.Agent.ID, Name: req.Agent.Name}
	}
	var cf map[string]any
	if err := json.Unmarshal([]byte(contact.CustomFields), &cf); err != nil || cf == nil {
		cf = map[string]any{}
	}
	spec.Contact = callevent.Contact{ID: contact.ID, Name: contact.Name, Phone: contact.Phone, Email: contact.Email, CustomFields: cf}
	if t := req.Timings; t != nil {
		sec := func(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }
		spec.RingFor, spec.TalkFor = sec(t.RingSeconds), sec(t.TalkSeconds)
		spec.RecordingAfter, spec.AnalysisAfter = sec(t.RecordingAfterSeconds), sec(t.AnalysisAfterSeconds)
	}
	call := &servicedb.Call{
		ID: spec.CallID, Scenario: req.Scenario, FromNumber: req.FromNumber, ToNumber: req.ToNumber, ContactID: contact.ID,
		ContactName: contact.Name, WebhookURL: req.EventWebhookURL, DispatchedAt: now,
	}
	events, err := s.generate(spec, now, s.cfg.TimeScale, base)
	if err != nil {
		return nil, nil, err
	}
	call.AgentName = events[0].payload.Call.Agent.Name
	call.FromNumber = events[0].payload.Call.FromNumber
	var deliveries []*servicedb.Delivery
	for _, e := range events {
		if e.payload.Event == callevent.KindRecordingAvailable {
			call.RecordingAt = e.at
		}
		if req.EventWebhookURL == "" || (p.events != nil && !p.events[e.payload.Event]) {
			continue
		}
		d, err := newDelivery(call.ID, e, req.EventWebhookURL, p.headers)
		if err != nil {
			return nil, nil, err
		}
		deliveries = append(deliveries, d)
	}
	return call, deliveries, nil
}

// timedEvent is a generated payload and the wall-clock time it is sent.
type timedEvent struct {
	payload callevent.Payload
	at      time.Time
}

// generate makes spec's events for a call whose first event is sent at
// sendFrom, the waits between them multiplied by scale (see planCall for
// the back-dating), with the emulator's own signed media links.
func (s *Server) generate(spec callevent.CallSpec, sendFrom time.Time, scale float64, base string) ([]timedEvent, error) {
	// A first pass with the call starting at sendFrom measures the
	// offsets of the events; callevent owns the defaults of the timings.
	probe := spec
	probe.Start = sendFrom
	offsets := make([]time.Duration, 0, 5)
	var span time.Duration
	for _, p := range probe.Events() {
		t, err := callevent.ParseTime(p.OccurredAt)
		if err != nil {
			return nil, fmt.Errorf("emulator: generated occurred_at %q: %v", p.OccurredAt, err)
		}
		off := t.Sub(sendFrom.UTC().Truncate(time.Microsecond))
		offsets = append(offsets, off)
		span = max(span, off)
	}
	// Back-date only when waits shrink; a scale above 1 sends every event
	// after it occurred anyway.
	spec.Start = sendFrom.Add(-time.Duration(float64(span) * max(0, 1-scale)))
	payloads := spec.Events()
	if len(payloads) != len(offsets) {
		return nil, fmt.Errorf("emulator: callevent generated %d events, then %d", len(offsets), len(payloads))
	}
	out := make([]timedEvent, len(payloads))
	for i, p := range payloads {
		at := sendFrom.Add(time.Duration(float64(offsets[i]) * scale))
		if p.Media != nil {
			p.Media = s.signedMedia(base, spec.CallID, at)
		}
		out[i] = timedEvent{payload: p, at: at}
	}
	return out, nil
}

// newDelivery is the delivery of one event: its id is the payload's, and
// it is due when the event is sent.
func newDelivery(callID string, e timedEvent, target string, headers [][2]string) (*servicedb.Delivery, error) {
	body, err := json.Marshal(e.payload)
	if err != nil {
		return nil, fmt.Errorf("emulator: encode payload: %w", err)
	}
	if headers == nil {
		headers = [][2]string{}
	}
	h, err := json.Marshal(headers)
	if err != nil {
		return nil, err
	}
	return &servicedb.Delivery{
		ID: e.payload.ID, CallID: callID, Event: e.payload.Event, URL: target, Headers: string(h), Payload: body,
		Status: StatusPending, MaxAttempts: callevent.MaxAttempts, NextAt: e.at, CreatedAt: e.at,
	}, nil
}

// nudge wakes the scheduler without blocking.
func (s *Server) nudge() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}
