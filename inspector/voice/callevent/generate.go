package callevent

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

// Flows CallSpec.Events can produce.
const (
	FlowCompleted = "completed" // started → connected → ended → recording_available → analysis_completed
	FlowFailed    = "failed"    // started → failed
)

// OutcomeCodes are the outcome codes of call.failed that calltap
// generates. The documentation names the reasons (busy, no answer,
// dispatch error) but not their spelling on the wire.
var OutcomeCodes = []string{"busy", "no_answer", "dispatch_error"}

// CallSpec describes one call to generate events for. Zero fields get
// defaults (see Events).
type CallSpec struct {
	CallID, From, To, CampaignID string
	Agent                        Agent
	Contact                      Contact
	Variables                    map[string]any
	Flow                         string    // FlowCompleted (default) or FlowFailed
	OutcomeCode                  string    // for FlowFailed: busy (default), no_answer or dispatch_error
	Start                        time.Time // default: so that the last event occurs now
	// RingFor is dialling until the answer (or, for a failed call, until
	// it gives up); TalkFor the conversation; RecordingAfter and
	// AnalysisAfter are counted from the end of the call.
	RingFor, TalkFor, RecordingAfter, AnalysisAfter time.Duration
	MediaBaseURL                                    string // recording and transcript links are made under it
	ExpiresIn                                       int    // lifetime of the media links, seconds
}

// Defaults of CallSpec.
const (
	DefaultFrom           = "+14155550100"
	DefaultTo             = "+12025550143"
	DefaultRingFor        = 7 * time.Second
	DefaultTalkFor        = 94 * time.Second
	DefaultRecordingAfter = 12 * time.Second
	DefaultAnalysisAfter  = 75 * time.Second
	DefaultMediaBaseURL   = "https://media.example.com"
	DefaultExpiresIn      = 3600
)

// withDefaults fills the zero fields of s.
func (s CallSpec) withDefaults() CallSpec {
	s.defaultParties()
	s.defaultContact()
	s.defaultTiming()
	if s.Start.IsZero() {
		// A call that has just ended: its last event occurs now, so
		// nothing sent at once is stamped as occurring after it was sent.
		s.Start = time.Now().Add(-s.span())
	}
	s.Start = s.Start.UTC().Truncate(time.Microsecond)
	if s.MediaBaseURL == "" {
		s.MediaBaseURL = DefaultMediaBaseURL
	}
	s.MediaBaseURL = strings.TrimRight(s.MediaBaseURL, "/")
	if s.ExpiresIn == 0 {
		s.ExpiresIn = DefaultExpiresIn
	}
	return s
}

// defaultParties fills the call's ids, numbers, agent and variables. The
// number called is the contact's phone when only that is given.
func (s *CallSpec) defaultParties() {
	if s.CallID == "" {
		s.CallID = uuid.NewString()
	}
	if s.From == "" {
		s.From = DefaultFrom
	}
	if s.To == "" {
		s.To = s.Contact.Phone
	}
	if s.To == "" {
		s.To = DefaultTo
	}
	if s.CampaignID == "" {
		s.CampaignID = uuid.NewString()
	}
	if s.Agent.ID == "" {
		s.Agent.ID = uuid.NewString()
	}
	if s.Agent.Name == "" {
		s.Agent.Name = "Ava"
	}
	if s.Variables == nil {
		s.Variables = map[string]any{"lead_id": "L-1001"}
	}
}

// defaultContact fills the contact; its phone is the number called.
func (s *CallSpec) defaultContact() {
	if s.Contact.ID == "" {
		s.Contact.ID = uuid.NewString()
	}
	if s.Contact.Name == "" {
		s.Contact.Name = "Jordan Lee"
	}
	if s.Contact.Phone == "" {
		s.Contact.Phone = s.To
	}
	if s.Contact.Email == "" {
		s.Contact.Email = "jordan.lee@example.com"
	}
	if s.Contact.CustomFields == nil {
		s.Contact.CustomFields = map[string]any{"city": "Austin", "plan": "trial"}
	}
}

// defaultTiming fills the flow, the failure's outcome code and the delays
// between the call's events.
func (s *CallSpec) defaultTiming() {
	if s.Flow == "" {
		s.Flow = FlowCompleted
	}
	if s.Flow == FlowFailed && s.OutcomeCode == "" {
		s.OutcomeCode = "busy"
	}
	if s.RingFor == 0 {
		s.RingFor = ringFor(s.OutcomeCode)
	}
	if s.TalkFor == 0 {
		s.TalkFor = DefaultTalkFor
	}
	if s.RecordingAfter == 0 {
		s.RecordingAfter = DefaultRecordingAfter
	}
	if s.AnalysisAfter == 0 {
		s.AnalysisAfter = DefaultAnalysisAfter
	}
}

// ringFor is how long a call rings before it connects or fails with
// outcomeCode: a no-answer rings out, a dispatch error barely starts.
func ringFor(outcomeCode string) time.Duration {
	switch outcomeCode {
	case "no_answer":
		return 30 * time.Second
	case "dispatch_error":
		return 400 * time.Millisecond
	}
	return DefaultRingFor
}

// span is how long after Start the call's last event occurs.
func (s CallSpec) span() time.Duration {
	if s.Flow == FlowFailed {
		return s.RingFor
	}
	return s.RingFor + s.TalkFor + max(s.RecordingAfter, s.AnalysisAfter)
}

// Events returns the payloads of the call in the documented order, each
// with a fresh delivery id, and timestamps consistent within the call:
//
//	completed: call.started → call.connected → call.ended → call.recording_available → call.analysis_completed
//	failed:    call.started → call.failed (with outcome_code)
//
// An unknown Flow is treated as completed.
func (s CallSpec) Events() []Payload {
	s = s.withDefaults()
	room := map[string]any{"sid": "RM_" + randomToken(12), "name": "call-" + s.CallID}
	agent, contact := s.Agent, s.Contact

	base := func() *Call {
		// Each event gets its own agent and contact, so that editing one
		// payload does not edit the others.
		agent, contact := agent, contact
		return &Call{
			CallID:          s.CallID,
			Direction:       "outbound",
			FromNumber:      s.From,
			ToNumber:        s.To,
			StartedAt:       FormatTime(s.Start),
			DurationSeconds: intPtr(0),
			AttemptNumber:   1,
			CampaignID:      s.CampaignID,
			Agent:           &agent,
			Contact:         &contact,
			Variables:       s.Variables,
		}
	}
	event := func(kind string, at time.Time, call *Call, upstream string) Payload {
		data, _ := json.Marshal(map[string]any{"event": upstream, "room": room, "created_at": at.Unix()})
		return Payload{ID: uuid.NewString(), Event: kind, OccurredAt: FormatTime(at), Call: call, Data: data}
	}

	started := base()
	started.Status = "dialing"
	out := []Payload{event(KindStarted, s.Start, started, "room_started")}

	if s.Flow == FlowFailed {
		end := s.Start.Add(s.RingFor)
		c := base()
		c.Status = "failed"
		c.Outcome = Str("not_connected")
		c.OutcomeCode = Str(s.OutcomeCode)
		c.EndedAt = Str(FormatTime(end))
		return append(out, event(KindFailed, end, c, "room_finished"))
	}

	answered := s.Start.Add(s.RingFor)
	end := answered.Add(s.TalkFor)
	connected := base()
	connected.Status = "in_progress"
	connected.AnsweredAt = Str(FormatTime(answered))
	out = append(out, event(KindConnected, answered, connected, "participant_joined"))

	final := func(status string) *Call {
		c := base()
		c.Status = status
		c.Outcome = Str("completed")
		c.AnsweredAt = Str(FormatTime(answered))
		c.EndedAt = Str(FormatTime(end))
		c.DurationSeconds = intPtr(int(end.Sub(answered).Round(time.Second) / time.Second))
		return c
	}
	out = append(out, event(KindEnded, end, final("completed"), "room_finished"))
	out = append(out, event(KindRecordingAvailable, end.Add(s.RecordingAfter), final("completed"), "egress_ended"))

	analyzed := final("completed")
	analyzed.Disposition = Str("interested")
	p := event(KindAnalysisCompleted, end.Add(s.AnalysisAfter), analyzed, "analysis_finished")
	score := 0.82
	p.Analysis = &Analysis{
		Summary:      fmt.Sprintf("%s called %s about the %s plan. %s was interested and asked for a follow-up call next week.", agent.Name, contact.Name, "trial", firstName(contact.Name)),
		ShortSummary: "Interested; follow-up next week.",
		Sentiment:    "positive",
		LeadScore:    &score,
		Disposition:  "interested",
		ExtractedResponses: []ExtractedResponse{
			{Question: "Are you interested in continuing after the trial?", VariableName: "interested", Answer: "Yes", Weight: 0.6},
			{Question: "When is a good time for a follow-up call?", VariableName: "follow_up_time", Answer: "Next Tuesday morning", Weight: 0.4},
		},
	}
	p.Media = s.media(end.Add(s.AnalysisAfter))
	return append(out, p)
}

// media builds signed-looking links that expire ExpiresIn after at.
func (s CallSpec) media(at time.Time) *Media {
	exp := strconv.FormatInt(at.Add(time.Duration(s.ExpiresIn)*time.Second).Unix(), 10)
	sig := randomToken(32)
	link := func(name string) string {
		return s.MediaBaseURL + "/calls/" + s.CallID + "/" + name + "?expires=" + exp + "&signature=" + sig
	}
	return &Media{RecordingURL: link("recording.ogg"), TranscriptURL: link("transcript.json"), ExpiresIn: s.ExpiresIn}
}

func firstName(name string) string {
	if f := strings.Fields(name); len(f) > 0 {
		return f[0]
	}
	return name
}

func intPtr(n int) *int { return &n }

// randomToken returns n random characters of [A-Za-z0-9].
func randomToken(n int) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, n)
	rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}

// SetPath sets a member of a decoded JSON object by a dotted path such as
// "call.variables.lead_id", creating objects on the way. A numeric segment
// indexes an existing array. value is used as JSON when it parses as JSON
// ("42", "true", `{"a":1}`), else as a string ("EZ-1").
func SetPath(payload map[string]any, path string, value string) error {
	if path == "" {
		return fmt.Errorf("empty path")
	}
	v := pathValue(value)
	segs := strings.Split(path, ".")
	var cur any = payload
	for i, seg := range segs {
		if seg == "" {
			return fmt.Errorf("path %q has an empty segment", path)
		}
		next, problem := setStep(cur, seg, i == len(segs)-1, v)
		if problem != "" {
			return fmt.Errorf("path %q: %s %s", path, strings.Join(segs[:i], "."), problem)
		}
		cur = next
	}
	return nil
}

// pathValue is value as SetPath sets it: its JSON when it is one JSON
// value (numbers as json.Number), else the string itself.
func pathValue(value string) any {
	dec := json.NewDecoder(strings.NewReader(value))
	dec.UseNumber()
	var parsed any
	if err := dec.Decode(&parsed); err == nil && !dec.More() && strings.TrimSpace(value) != "" {
		return parsed
	}
	return value
}

// setStep takes one segment of a SetPath path in cur: it sets v there when
// the segment is the last, else returns the member to go on in, creating
// an object where there is none. problem says, after the path so far, why
// the segment cannot be taken.
func setStep(cur any, seg string, last bool, v any) (next any, problem string) {
	switch c := cur.(type) {
	case map[string]any:
		return setInObject(c, seg, last, v), ""
	case []any:
		return setInArray(c, seg, last, v)
	default:
		return nil, fmt.Sprintf("is a %s, not an object", jsonType(c))
	}
}

// setInObject is setStep in an object.
func setInObject(obj map[string]any, key string, last bool, v any) (next any) {
	if last {
		obj[key] = v
		return nil
	}
	next, ok := obj[key]
	if !ok || next == nil {
		next = map[string]any{}
		obj[key] = next
	}
	return next
}

// setInArray is setStep in an array: the segment must index a member.
func setInArray(arr []any, seg string, last bool, v any) (next any, problem string) {
	n, err := strconv.Atoi(seg)
	if err != nil || n < 0 || n >= len(arr) {
		return nil, fmt.Sprintf("is an array of %d; %q is not an index in it", len(arr), seg)
	}
	if last {
		arr[n] = v
		return nil, ""
	}
	if arr[n] == nil {
		arr[n] = map[string]any{}
	}
	return arr[n], ""
}

// ToMap turns a payload into a decoded JSON object (numbers as json.Number)
// for SetPath.
func (p Payload) ToMap() (map[string]any, error) {
	b, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return nil, err
	}
	return m, nil
}
