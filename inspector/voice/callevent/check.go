package callevent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"sort"
	"strings"
	"time"
)

// Finding is one contract check result: an annotation, never a rejection.
type Finding struct {
	Code     string `json:"code"`
	Severity string `json:"severity"` // error | warning | info
	Path     string `json:"path"`     // dotted path in the payload; "" for the body
	Message  string `json:"message"`
}

// Severities.
const (
	SevError   = "error"
	SevWarning = "warning"
	SevInfo    = "info"
)

// Finding codes.
const (
	CodeNotJSON        = "not_json"            // body is not a JSON object
	CodeMissing        = "missing_field"       // a documented field is absent
	CodeWrongType      = "wrong_type"          // a field has another JSON type than documented
	CodeUUID           = "invalid_uuid"        // a UUID field is not a UUID
	CodeTimestamp      = "invalid_timestamp"   // not ISO 8601
	CodeNoOffset       = "timestamp_no_offset" // ISO 8601 but without an offset
	CodeOrder          = "timestamps_out_of_order"
	CodeDuration       = "duration_mismatch"    // duration_seconds ≠ ended − answered
	CodePhone          = "invalid_phone"        // not + and a country code
	CodeUnknownEvent   = "unknown_event"        // not one of the six kinds
	CodeUnknownField   = "unknown_field"        // not in the documentation; kept
	CodeUnstableData   = "unstable_data"        // data is not a stable contract
	CodeOutcomeMissing = "outcome_code_missing" // call.failed without outcome_code
	CodeInconsistent   = "inconsistent_with_event"
	CodeFuture         = "occurred_after_received" // occurred_at is later than the event reached us
)

// FutureTolerance is how far occurred_at may lie after the time an event
// was received before CheckReceived flags it: clocks of two machines
// differ by a little as a matter of course.
const FutureTolerance = time.Second

// Known members, to point out (and keep) the others.
var (
	topFields      = []string{"id", "event", "occurred_at", "call", "data", "analysis", "media"}
	callFields     = []string{"call_id", "direction", "status", "outcome", "outcome_code", "disposition", "from_number", "to_number", "started_at", "answered_at", "ended_at", "duration_seconds", "attempt_number", "campaign_id", "agent", "contact", "variables"}
	agentFields    = []string{"id", "name"}
	contactFields  = []string{"id", "name", "phone", "email", "custom_fields"}
	analysisFields = []string{"summary", "short_summary", "sentiment", "lead_score", "disposition", "extracted_responses"}
	responseFields = []string{"question", "variableName", "answer", "weight"}
	mediaFields    = []string{"recording_url", "transcript_url", "expires_in"}
)

var uuidRE = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// IsUUID reports whether s is a UUID in its canonical textual form.
func IsUUID(s string) bool { return uuidRE.MatchString(s) }

// Check compares a body with the event contract of the documentation
// (sections 6.4 to 6.6) and returns what it finds, errors first. It never
// fails: whatever the body holds, the result is a list of annotations.
// Callers usually check only bodies that Index recognised as call events.
func Check(body []byte) []Finding {
	c := &checker{}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil || dec.More() {
		c.add(CodeNotJSON, SevError, "", "body is not valid JSON")
		return c.out
	}
	top, ok := v.(map[string]any)
	if !ok {
		c.add(CodeNotJSON, SevError, "", "body is JSON but not an object; the service sends an object")
		return c.out
	}
	c.payload(top)
	if c.out == nil {
		return []Finding{} // an empty list, not null, in JSON
	}
	sort.SliceStable(c.out, func(i, j int) bool { return sevRank(c.out[i].Severity) < sevRank(c.out[j].Severity) })
	return c.out
}

// CheckReceived is Check for an event received at the given time: it also
// flags an event stamped as occurring after it arrived, which no real
// delivery can be. That is a sender's clock running ahead of ours, or a
// synthetic event stamped carelessly.
func CheckReceived(body []byte, received time.Time) []Finding {
	out := Check(body)
	if received.IsZero() {
		return out
	}
	var p struct {
		OccurredAt string `json:"occurred_at"`
	}
	if json.Unmarshal(body, &p) != nil {
		return out
	}
	at, err := ParseTime(p.OccurredAt)
	if err != nil && !errors.Is(err, ErrNoOffset) {
		return out
	}
	if ahead := at.Sub(received); ahead > FutureTolerance {
		out = append(out, Finding{Code: CodeFuture, Severity: SevWarning, Path: "occurred_at",
			Message: fmt.Sprintf("occurred_at is %s after the event was received (%s): the sender's clock is ahead of this machine's, or the event is synthetic",
				ahead.Round(time.Millisecond), FormatTime(received))})
		sort.SliceStable(out, func(i, j int) bool { return sevRank(out[i].Severity) < sevRank(out[j].Severity) })
	}
	return out
}

func sevRank(s string) int {
	switch s {
	case SevError:
		return 0
	case SevWarning:
		return 1
	}
	return 2
}

type checker struct {
	out []Finding
}

func (c *checker) add(code, sev, path, format string, args ...any) {
	c.out = append(c.out, Finding{Code: code, Severity: sev, Path: path, Message: fmt.Sprintf(format, args...)})
}

func jsonType(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case string:
		return "string"
	case json.Number:
		return "number"
	case bool:
		return "boolean"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return "unknown"
}

func join(parent, key string) string {
	if parent == "" {
		return key
	}
	return parent + "." + key
}

// str reads a string member. present reports whether the key exists; ok
// whether it is a string. A missing required member and a wrong type are
// reported with sev.
func (c *checker) str(obj map[string]any, parent, key, sev string, required bool) (s string, ok bool) {
	path := join(parent, key)
	v, present := obj[key]
	if !present {
		if required {
			c.add(CodeMissing, sev, path, "%s is missing", path)
		}
		return "", false
	}
	s, ok = v.(string)
	if !ok {
		c.add(CodeWrongType, sev, path, "%s should be a string, got %s", path, jsonType(v))
	}
	return s, ok
}

// nullableStr reads a "string or null" member: ok is false for null too.
func (c *checker) nullableStr(obj map[string]any, parent, key string) (string, bool) {
	path := join(parent, key)
	v, present := obj[key]
	if !present {
		c.add(CodeMissing, SevWarning, path, "%s is missing (documented as string or null)", path)
		return "", false
	}
	if v == nil {
		return "", false
	}
	s, ok := v.(string)
	if !ok {
		c.add(CodeWrongType, SevWarning, path, "%s should be a string or null, got %s", path, jsonType(v))
	}
	return s, ok
}

func (c *checker) object(obj map[string]any, parent, key, sev string, required bool) (map[string]any, bool) {
	path := join(parent, key)
	v, present := obj[key]
	if !present {
		if required {
			c.add(CodeMissing, sev, path, "%s is missing", path)
		}
		return nil, false
	}
	m, ok := v.(map[string]any)
	if !ok {
		c.add(CodeWrongType, sev, path, "%s should be an object, got %s", path, jsonType(v))
	}
	return m, ok
}

// integer reads an integer member; ok is false when absent, null or not an
// integer (the latter reported).
func (c *checker) integer(obj map[string]any, parent, key string, nullable bool) (int64, bool) {
	path := join(parent, key)
	v, present := obj[key]
	if !present {
		c.add(CodeMissing, SevWarning, path, "%s is missing", path)
		return 0, false
	}
	if v == nil {
		if !nullable {
			c.add(CodeWrongType, SevWarning, path, "%s should be an integer, got null", path)
		}
		return 0, false
	}
	n, ok := v.(json.Number)
	if !ok {
		c.add(CodeWrongType, SevWarning, path, "%s should be an integer, got %s", path, jsonType(v))
		return 0, false
	}
	i, err := n.Int64()
	if err != nil {
		c.add(CodeWrongType, SevWarning, path, "%s should be an integer, got %s", path, n)
		return 0, false
	}
	return i, true
}

func (c *checker) unknown(obj map[string]any, parent string, known []string) {
	var extra []string
	for k := range obj {
		if !contains(known, k) {
			extra = append(extra, k)
		}
	}
	sort.Strings(extra)
	for _, k := range extra {
		path := join(parent, k)
		c.add(CodeUnknownField, SevInfo, path, "%s is not in the documentation; it is kept and shown", path)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func (c *checker) uuid(obj map[string]any, parent, key, sev string, required bool) {
	s, ok := c.str(obj, parent, key, sev, required)
	if ok && !IsUUID(s) {
		path := join(parent, key)
		c.add(CodeUUID, sev, path, "%s should be a UUID, got %q", path, truncate(s))
	}
}

func truncate(s string) string {
	const max = 80
	if len(s) <= max {
		return s
	}
	return s[:max] + "…"
}

// timestamp checks an ISO 8601 member and returns its time when usable.
func (c *checker) timestamp(obj map[string]any, parent, key string, nullable, required bool) (time.Time, bool) {
	path := join(parent, key)
	v, present := obj[key]
	if !present {
		if required {
			c.add(CodeMissing, SevError, path, "%s is missing", path)
		} else {
			c.add(CodeMissing, SevWarning, path, "%s is missing", path)
		}
		return time.Time{}, false
	}
	if v == nil {
		if !nullable {
			c.add(CodeWrongType, SevWarning, path, "%s should be a timestamp, got null", path)
		}
		return time.Time{}, false
	}
	s, ok := v.(string)
	if !ok {
		c.add(CodeWrongType, SevError, path, "%s should be an ISO 8601 string, got %s", path, jsonType(v))
		return time.Time{}, false
	}
	t, err := ParseTime(s)
	switch {
	case errors.Is(err, ErrNoOffset):
		c.add(CodeNoOffset, SevError, path, "%s %q has no UTC offset; it is read as UTC", path, truncate(s))
		return t, true
	case err != nil:
		c.add(CodeTimestamp, SevError, path, "%s %q is not an ISO 8601 timestamp: %v", path, truncate(s), err)
		return time.Time{}, false
	}
	return t, true
}

var phoneRE = regexp.MustCompile(`^\+[1-9][0-9]{6,14}$`)

// IsPhoneNumber reports whether s is a phone number in the E.164 form the
// service documents: a +, a country code that does not start with 0, and 7
// to 15 digits in all, with no spaces or punctuation.
func IsPhoneNumber(s string) bool { return phoneRE.MatchString(s) }

func (c *checker) phone(obj map[string]any, parent, key, sev string, required bool) {
	s, ok := c.str(obj, parent, key, sev, required)
	if !ok {
		return
	}
	path := join(parent, key)
	switch {
	case !strings.HasPrefix(s, "+") || len(s) < 2 || s[1] < '1' || s[1] > '9':
		c.add(CodePhone, sev, path, "%s %q should start with + and a country code", path, truncate(s))
	case !IsPhoneNumber(s):
		c.add(CodePhone, SevWarning, path, "%s %q is not in E.164 form (+ then 7 to 15 digits, no spaces or punctuation)", path, truncate(s))
	}
}

func (c *checker) payload(top map[string]any) {
	c.uuid(top, "", "id", SevError, true)
	event, hasEvent := c.str(top, "", "event", SevError, true)
	if hasEvent && !IsKind(event) {
		c.add(CodeUnknownEvent, SevWarning, "event", "event %q is not one of the six documented kinds (%s); it is kept and shown", truncate(event), strings.Join(Kinds, ", "))
	}
	c.timestamp(top, "", "occurred_at", false, true)
	if call, ok := c.object(top, "", "call", SevError, true); ok {
		c.call(call, event)
	}
	if d, present := top["data"]; !present {
		c.add(CodeMissing, SevWarning, "data", "data is missing; every documented event carries it (the raw upstream event)")
	} else {
		c.add(CodeUnstableData, SevInfo, "data", "data is the raw upstream event (%s): its shape varies and is not a stable contract (documentation section 9); build against the call block", jsonType(d))
	}

	analysisRequired := event == KindAnalysisCompleted
	if a, ok := c.object(top, "", "analysis", SevError, analysisRequired); ok {
		c.analysis(a, analysisRequired)
	}
	if m, ok := c.object(top, "", "media", SevError, analysisRequired); ok {
		c.media(m)
	}
	c.unknown(top, "", topFields)
}

func (c *checker) call(call map[string]any, event string) {
	const p = "call"
	c.uuid(call, p, "call_id", SevError, true)
	c.str(call, p, "direction", SevWarning, true)
	c.str(call, p, "status", SevWarning, true)
	c.nullableStr(call, p, "outcome")
	outcomeCode, hasOutcomeCode := c.nullableStr(call, p, "outcome_code")
	c.nullableStr(call, p, "disposition")
	c.phone(call, p, "from_number", SevError, true)
	c.phone(call, p, "to_number", SevError, true)
	t := c.callTimes(call)
	hasDur := c.callDuration(call, t)
	if n, ok := c.integer(call, p, "attempt_number", false); ok && n < 1 {
		c.add(CodeWrongType, SevWarning, "call.attempt_number", "call.attempt_number is %d; attempts are counted from 1", n)
	}
	c.uuid(call, p, "campaign_id", SevWarning, true)
	c.callAgent(call)
	c.callContact(call)
	c.object(call, p, "variables", SevWarning, true)
	c.unknown(call, p, callFields)
	c.callFitsEvent(event, hasOutcomeCode && outcomeCode != "", t.hasAnswered, t.hasEnded, hasDur)
}

// callTimes are a call block's timestamps, each with whether it is set and
// readable.
type callTimes struct {
	started, answered, ended          time.Time
	hasStarted, hasAnswered, hasEnded bool
}

// callTimes checks and reads the call block's timestamps, and checks that
// they are in order: started, answered, ended.
func (c *checker) callTimes(call map[string]any) callTimes {
	const p = "call"
	var t callTimes
	t.started, t.hasStarted = c.timestamp(call, p, "started_at", false, false)
	t.answered, t.hasAnswered = c.timestamp(call, p, "answered_at", true, false)
	t.ended, t.hasEnded = c.timestamp(call, p, "ended_at", true, false)
	if t.hasStarted && t.hasAnswered && t.answered.Before(t.started) {
		c.add(CodeOrder, SevError, "call.answered_at", "call.answered_at (%s) is before call.started_at (%s)", FormatTime(t.answered), FormatTime(t.started))
	}
	if t.hasAnswered && t.hasEnded && t.ended.Before(t.answered) {
		c.add(CodeOrder, SevError, "call.ended_at", "call.ended_at (%s) is before call.answered_at (%s)", FormatTime(t.ended), FormatTime(t.answered))
	} else if t.hasStarted && t.hasEnded && t.ended.Before(t.started) {
		c.add(CodeOrder, SevError, "call.ended_at", "call.ended_at (%s) is before call.started_at (%s)", FormatTime(t.ended), FormatTime(t.started))
	}
	return t
}

// callDuration checks duration_seconds against ended_at − answered_at, to
// the second, and reports whether it is set.
func (c *checker) callDuration(call map[string]any, t callTimes) bool {
	dur, hasDur := c.integer(call, "call", "duration_seconds", true)
	if hasDur && t.hasAnswered && t.hasEnded {
		want := t.ended.Sub(t.answered).Seconds()
		if math.Abs(float64(dur)-want) > 1 {
			c.add(CodeDuration, SevError, "call.duration_seconds", "call.duration_seconds is %d but ended_at − answered_at is %.3f s (more than a second apart)", dur, want)
		}
	}
	return hasDur
}

// callAgent checks the call block's agent object.
func (c *checker) callAgent(call map[string]any) {
	const ap = "call.agent"
	if a, ok := c.object(call, "call", "agent", SevWarning, true); ok {
		c.uuid(a, ap, "id", SevWarning, true)
		c.str(a, ap, "name", SevWarning, true)
		c.unknown(a, ap, agentFields)
	}
}

// callContact checks the call block's contact object; its phone is checked
// only when set.
func (c *checker) callContact(call map[string]any) {
	const cp = "call.contact"
	ct, ok := c.object(call, "call", "contact", SevWarning, true)
	if !ok {
		return
	}
	c.uuid(ct, cp, "id", SevWarning, true)
	c.str(ct, cp, "name", SevWarning, true)
	if v, ok := ct["phone"]; ok && v != "" && v != nil {
		c.phone(ct, cp, "phone", SevWarning, false)
	}
	c.str(ct, cp, "email", SevWarning, true)
	c.object(ct, cp, "custom_fields", SevWarning, true)
	c.unknown(ct, cp, contactFields)
}

// callFitsEvent checks that the call block says what its event says
// (documentation section 3): a failed call has an outcome code and was
// never answered; a connected one was answered; an ended one has its end
// and final duration.
func (c *checker) callFitsEvent(event string, hasOutcomeCode, hasAnswered, hasEnded, hasDur bool) {
	switch event {
	case KindFailed:
		if !hasOutcomeCode {
			c.add(CodeOutcomeMissing, SevError, "call.outcome_code", "call.failed must set call.outcome_code to say why the call never connected (busy, no answer, dispatch error)")
		}
		if hasAnswered {
			c.add(CodeInconsistent, SevWarning, "call.answered_at", "call.failed means the call never connected, yet call.answered_at is set")
		}
	case KindConnected:
		if !hasAnswered {
			c.add(CodeInconsistent, SevWarning, "call.answered_at", "call.connected means the callee answered, yet call.answered_at is not set")
		}
	case KindEnded:
		if !hasEnded {
			c.add(CodeInconsistent, SevWarning, "call.ended_at", "call.ended means the call finished, yet call.ended_at is not set")
		}
		if !hasDur {
			c.add(CodeInconsistent, SevWarning, "call.duration_seconds", "call.ended carries the final duration, yet call.duration_seconds is not set")
		}
	}
}

func (c *checker) analysis(a map[string]any, required bool) {
	const p = "analysis"
	sev := SevWarning
	for _, k := range []string{"summary", "short_summary", "sentiment", "disposition"} {
		c.str(a, p, k, sev, required)
	}
	switch v, ok := a["lead_score"]; {
	case !ok:
		c.add(CodeMissing, SevError, "analysis.lead_score", "analysis.lead_score is missing; it is documented as a number")
	default:
		if _, isNum := v.(json.Number); !isNum {
			c.add(CodeWrongType, SevError, "analysis.lead_score", "analysis.lead_score should be a number, got %s", jsonType(v))
		}
	}
	switch v, ok := a["extracted_responses"]; {
	case !ok:
		if required {
			c.add(CodeMissing, sev, "analysis.extracted_responses", "analysis.extracted_responses is missing")
		}
	default:
		items, isArr := v.([]any)
		if !isArr {
			c.add(CodeWrongType, sev, "analysis.extracted_responses", "analysis.extracted_responses should be an array, got %s", jsonType(v))
			break
		}
		for i, it := range items {
			path := fmt.Sprintf("analysis.extracted_responses.%d", i)
			obj, ok := it.(map[string]any)
			if !ok {
				c.add(CodeWrongType, sev, path, "%s should be an object, got %s", path, jsonType(it))
				continue
			}
			c.str(obj, path, "question", sev, true)
			c.str(obj, path, "variableName", sev, true)
			c.str(obj, path, "answer", sev, true)
			if w, ok := obj["weight"]; !ok {
				c.add(CodeMissing, sev, path+".weight", "%s.weight is missing", path)
			} else if _, isNum := w.(json.Number); !isNum {
				c.add(CodeWrongType, sev, path+".weight", "%s.weight should be a number, got %s", path, jsonType(w))
			}
			c.unknown(obj, path, responseFields)
		}
	}
	c.unknown(a, p, analysisFields)
}

func (c *checker) media(m map[string]any) {
	const p = "media"
	for _, k := range []string{"recording_url", "transcript_url"} {
		if s, ok := c.str(m, p, k, SevWarning, true); ok && s != "" && !strings.HasPrefix(s, "https://") && !strings.HasPrefix(s, "http://") {
			c.add(CodeWrongType, SevWarning, join(p, k), "%s.%s should be an http(s) URL", p, k)
		}
	}
	c.integer(m, p, "expires_in", false)
	c.unknown(m, p, mediaFields)
}
