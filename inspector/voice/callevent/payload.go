// Package callevent is the voice service's event contract (documentation
// sections 3 and 6): the payload envelope, the call block, the analysis and
// media blocks and the six event kinds. It indexes captured bodies, checks
// them against the contract, summarises the events of one call and generates
// realistic events for the trigger command and the service emulator.
//
// Many value sets of the service are "not shown" in its documentation, so
// the package is tolerant: unknown fields and values are kept and shown, and
// nothing here rejects a body because of its content.
package callevent

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"sort"
)

// The six event kinds (documentation section 6.2).
const (
	KindStarted            = "call.started"
	KindConnected          = "call.connected"
	KindEnded              = "call.ended"
	KindFailed             = "call.failed"
	KindRecordingAvailable = "call.recording_available"
	KindAnalysisCompleted  = "call.analysis_completed"
)

// Kinds lists the six event kinds in the order a completed call sends them
// (call.failed, which replaces call.connected and call.ended, after them).
var Kinds = []string{KindStarted, KindConnected, KindEnded, KindRecordingAvailable, KindAnalysisCompleted, KindFailed}

// IsKind reports whether s is one of the six documented event kinds.
func IsKind(s string) bool {
	switch s {
	case KindStarted, KindConnected, KindEnded, KindFailed, KindRecordingAvailable, KindAnalysisCompleted:
		return true
	}
	return false
}

// Payload is the body of one event delivery (section 6.4).
//
// Fields the contract does not name, and named fields whose value does not
// fit the documented type, are kept raw in Extra and written back on
// marshalling, so a payload survives a round trip.
type Payload struct {
	ID         string          // unique per delivery (UUID)
	Event      string          // event kind
	OccurredAt string          // ISO 8601 with offset, kept as sent; see ParseTime
	Call       *Call           // the stable contract
	Data       json.RawMessage // raw upstream event: not a stable contract
	Analysis   *Analysis       // on call.analysis_completed
	Media      *Media          // on call.analysis_completed (and perhaps call.recording_available)

	Extra map[string]json.RawMessage
}

// Call is the call block (section 6.5). Nullable fields are pointers.
type Call struct {
	CallID          string
	Direction       string
	Status          string
	Outcome         *string
	OutcomeCode     *string // set on call.failed to say why
	Disposition     *string
	FromNumber      string
	ToNumber        string
	StartedAt       string
	AnsweredAt      *string
	EndedAt         *string // documented as a timestamp; null until the call ends
	DurationSeconds *int    // final from call.ended
	AttemptNumber   int
	CampaignID      string
	Agent           *Agent
	Contact         *Contact
	Variables       map[string]any // how the client finds its record

	Extra map[string]json.RawMessage
}

// Agent is the call block's agent object.
type Agent struct {
	ID   string
	Name string

	Extra map[string]json.RawMessage
}

// Contact is the call block's contact object.
type Contact struct {
	ID           string
	Name         string
	Phone        string
	Email        string
	CustomFields map[string]any

	Extra map[string]json.RawMessage
}

// Analysis is the post-call analysis block of call.analysis_completed
// (section 6.6).
type Analysis struct {
	Summary            string
	ShortSummary       string
	Sentiment          string
	LeadScore          *float64
	Disposition        string
	ExtractedResponses []ExtractedResponse

	Extra map[string]json.RawMessage
}

// ExtractedResponse is one item of analysis.extracted_responses.
type ExtractedResponse struct {
	Question     string
	VariableName string // "variableName" on the wire
	Answer       string
	Weight       float64

	Extra map[string]json.RawMessage
}

// Media holds the signed, short-lived links of a call's files (section 6.6).
type Media struct {
	RecordingURL  string
	TranscriptURL string
	ExpiresIn     int // seconds the links live

	Extra map[string]json.RawMessage
}

// Str returns a pointer to s, for the nullable fields.
func Str(s string) *string { return &s }

// --- decoding -----------------------------------------------------------

// fields splits a JSON object into its members.
type fields map[string]json.RawMessage

var null = []byte("null")

func splitObject(b []byte) (fields, error) {
	var m fields
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	if m == nil {
		return nil, errors.New("callevent: not a JSON object")
	}
	return m, nil
}

// take decodes member key into dst and removes it from m. A member that
// does not fit dst's type stays in m (and so in Extra), as does a null for a
// type that cannot hold one, so that marshalling writes it back unchanged.
func (m fields) take(key string, dst any) {
	raw, ok := m[key]
	if !ok {
		return
	}
	if bytes.Equal(bytes.TrimSpace(raw), null) {
		switch reflect.TypeOf(dst).Elem().Kind() {
		case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Interface:
			delete(m, key)
		}
		return
	}
	// Decode into a fresh value: a failed Unmarshal may leave dst half set.
	v := reflect.New(reflect.TypeOf(dst).Elem())
	if json.Unmarshal(raw, v.Interface()) != nil {
		return
	}
	reflect.ValueOf(dst).Elem().Set(v.Elem())
	delete(m, key)
}

// extra returns what is left, or nil.
func (m fields) extra() map[string]json.RawMessage {
	if len(m) == 0 {
		return nil
	}
	return map[string]json.RawMessage(m)
}

// UnmarshalJSON decodes a payload, keeping what it does not know in Extra.
// It fails only when b is not a JSON object.
func (p *Payload) UnmarshalJSON(b []byte) error {
	m, err := splitObject(b)
	if err != nil {
		return err
	}
	*p = Payload{}
	m.take("id", &p.ID)
	m.take("event", &p.Event)
	m.take("occurred_at", &p.OccurredAt)
	m.take("call", &p.Call)
	if raw, ok := m["data"]; ok {
		p.Data = append(json.RawMessage(nil), raw...)
		delete(m, "data")
	}
	m.take("analysis", &p.Analysis)
	m.take("media", &p.Media)
	p.Extra = m.extra()
	return nil
}

// UnmarshalJSON decodes a call block, keeping what it does not know.
func (c *Call) UnmarshalJSON(b []byte) error {
	m, err := splitObject(b)
	if err != nil {
		return err
	}
	*c = Call{}
	m.take("call_id", &c.CallID)
	m.take("direction", &c.Direction)
	m.take("status", &c.Status)
	m.take("outcome", &c.Outcome)
	m.take("outcome_code", &c.OutcomeCode)
	m.take("disposition", &c.Disposition)
	m.take("from_number", &c.FromNumber)
	m.take("to_number", &c.ToNumber)
	m.take("started_at", &c.StartedAt)
	m.take("answered_at", &c.AnsweredAt)
	m.take("ended_at", &c.EndedAt)
	m.take("duration_seconds", &c.DurationSeconds)
	m.take("attempt_number", &c.AttemptNumber)
	m.take("campaign_id", &c.CampaignID)
	m.take("agent", &c.Agent)
	m.take("contact", &c.Contact)
	m.take("variables", &c.Variables)
	c.Extra = m.extra()
	return nil
}

// UnmarshalJSON decodes an agent object, keeping what it does not know.
func (a *Agent) UnmarshalJSON(b []byte) error {
	m, err := splitObject(b)
	if err != nil {
		return err
	}
	*a = Agent{}
	m.take("id", &a.ID)
	m.take("name", &a.Name)
	a.Extra = m.extra()
	return nil
}

// UnmarshalJSON decodes a contact object, keeping what it does not know.
func (c *Contact) UnmarshalJSON(b []byte) error {
	m, err := splitObject(b)
	if err != nil {
		return err
	}
	*c = Contact{}
	m.take("id", &c.ID)
	m.take("name", &c.Name)
	m.take("phone", &c.Phone)
	m.take("email", &c.Email)
	m.take("custom_fields", &c.CustomFields)
	c.Extra = m.extra()
	return nil
}

// UnmarshalJSON decodes an analysis block, keeping what it does not know.
func (a *Analysis) UnmarshalJSON(b []byte) error {
	m, err := splitObject(b)
	if err != nil {
		return err
	}
	*a = Analysis{}
	m.take("summary", &a.Summary)
	m.take("short_summary", &a.ShortSummary)
	m.take("sentiment", &a.Sentiment)
	m.take("lead_score", &a.LeadScore)
	m.take("disposition", &a.Disposition)
	m.take("extracted_responses", &a.ExtractedResponses)
	a.Extra = m.extra()
	return nil
}

// UnmarshalJSON decodes an extracted response, keeping what it does not know.
func (r *ExtractedResponse) UnmarshalJSON(b []byte) error {
	m, err := splitObject(b)
	if err != nil {
		return err
	}
	*r = ExtractedResponse{}
	m.take("question", &r.Question)
	m.take("variableName", &r.VariableName)
	m.take("answer", &r.Answer)
	m.take("weight", &r.Weight)
	r.Extra = m.extra()
	return nil
}

// UnmarshalJSON decodes a media block, keeping what it does not know.
func (md *Media) UnmarshalJSON(b []byte) error {
	m, err := splitObject(b)
	if err != nil {
		return err
	}
	*md = Media{}
	m.take("recording_url", &md.RecordingURL)
	m.take("transcript_url", &md.TranscriptURL)
	m.take("expires_in", &md.ExpiresIn)
	md.Extra = m.extra()
	return nil
}

// --- encoding -----------------------------------------------------------

// objectWriter writes a JSON object with the known members in documented
// order, then the extra members sorted by name. An extra member with the
// name of a known one replaces it: it is a value that did not fit the type.
type objectWriter struct {
	buf     bytes.Buffer
	extra   map[string]json.RawMessage
	written map[string]bool
	err     error
}

func newObjectWriter(extra map[string]json.RawMessage) *objectWriter {
	w := &objectWriter{extra: extra, written: make(map[string]bool, len(extra))}
	w.buf.WriteByte('{')
	return w
}

func (w *objectWriter) member(key string, raw []byte) {
	if w.buf.Len() > 1 {
		w.buf.WriteByte(',')
	}
	k, _ := json.Marshal(key)
	w.buf.Write(k)
	w.buf.WriteByte(':')
	w.buf.Write(raw)
	w.written[key] = true
}

// field writes key with v, unless omit is set (and no extra value exists).
func (w *objectWriter) field(key string, v any, omit bool) {
	if raw, ok := w.extra[key]; ok {
		w.member(key, raw)
		return
	}
	if omit || w.err != nil {
		return
	}
	b, err := json.Marshal(v)
	if err != nil {
		w.err = err
		return
	}
	w.member(key, b)
}

func (w *objectWriter) finish() ([]byte, error) {
	if w.err != nil {
		return nil, w.err
	}
	keys := make([]string, 0, len(w.extra))
	for k := range w.extra {
		if !w.written[k] {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		w.member(k, w.extra[k])
	}
	w.buf.WriteByte('}')
	return w.buf.Bytes(), nil
}

// MarshalJSON writes the payload in documented order; nil blocks are left
// out, except call, which every event carries.
func (p Payload) MarshalJSON() ([]byte, error) {
	w := newObjectWriter(p.Extra)
	w.field("id", p.ID, false)
	w.field("event", p.Event, false)
	w.field("occurred_at", p.OccurredAt, false)
	w.field("call", p.Call, false)
	if len(p.Data) > 0 {
		w.field("data", p.Data, false)
	} else {
		w.field("data", nil, true)
	}
	w.field("analysis", p.Analysis, p.Analysis == nil)
	w.field("media", p.Media, p.Media == nil)
	return w.finish()
}

// MarshalJSON writes every call block field in documented order.
func (c Call) MarshalJSON() ([]byte, error) {
	w := newObjectWriter(c.Extra)
	w.field("call_id", c.CallID, false)
	w.field("direction", c.Direction, false)
	w.field("status", c.Status, false)
	w.field("outcome", c.Outcome, false)
	w.field("outcome_code", c.OutcomeCode, false)
	w.field("disposition", c.Disposition, false)
	w.field("from_number", c.FromNumber, false)
	w.field("to_number", c.ToNumber, false)
	w.field("started_at", c.StartedAt, false)
	w.field("answered_at", c.AnsweredAt, false)
	w.field("ended_at", c.EndedAt, false)
	w.field("duration_seconds", c.DurationSeconds, false)
	w.field("attempt_number", c.AttemptNumber, false)
	w.field("campaign_id", c.CampaignID, false)
	w.field("agent", c.Agent, false)
	w.field("contact", c.Contact, false)
	vars := c.Variables
	if vars == nil {
		vars = map[string]any{}
	}
	w.field("variables", vars, false)
	return w.finish()
}

// MarshalJSON writes the agent object.
func (a Agent) MarshalJSON() ([]byte, error) {
	w := newObjectWriter(a.Extra)
	w.field("id", a.ID, false)
	w.field("name", a.Name, false)
	return w.finish()
}

// MarshalJSON writes the contact object.
func (c Contact) MarshalJSON() ([]byte, error) {
	w := newObjectWriter(c.Extra)
	w.field("id", c.ID, false)
	w.field("name", c.Name, false)
	w.field("phone", c.Phone, false)
	w.field("email", c.Email, false)
	cf := c.CustomFields
	if cf == nil {
		cf = map[string]any{}
	}
	w.field("custom_fields", cf, false)
	return w.finish()
}

// MarshalJSON writes the analysis block.
func (a Analysis) MarshalJSON() ([]byte, error) {
	w := newObjectWriter(a.Extra)
	w.field("summary", a.Summary, false)
	w.field("short_summary", a.ShortSummary, false)
	w.field("sentiment", a.Sentiment, false)
	w.field("lead_score", a.LeadScore, false)
	w.field("disposition", a.Disposition, false)
	er := a.ExtractedResponses
	if er == nil {
		er = []ExtractedResponse{}
	}
	w.field("extracted_responses", er, false)
	return w.finish()
}

// MarshalJSON writes one extracted response.
func (r ExtractedResponse) MarshalJSON() ([]byte, error) {
	w := newObjectWriter(r.Extra)
	w.field("question", r.Question, false)
	w.field("variableName", r.VariableName, false)
	w.field("answer", r.Answer, false)
	w.field("weight", r.Weight, false)
	return w.finish()
}

// MarshalJSON writes the media block.
func (md Media) MarshalJSON() ([]byte, error) {
	w := newObjectWriter(md.Extra)
	w.field("recording_url", md.RecordingURL, false)
	w.field("transcript_url", md.TranscriptURL, false)
	w.field("expires_in", md.ExpiresIn, false)
	return w.finish()
}
