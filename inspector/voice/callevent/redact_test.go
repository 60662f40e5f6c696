package callevent

import (
	"encoding/json"
	"strings"
	"testing"
)

const personal = `{"id":"0a3f6c1e-8d52-4b7a-9e11-2c4d5e6f7a80","event":"call.analysis_completed","occurred_at":"2026-11-22T10:05:00+00:00",
 "call":{"call_id":"6f1c1c7e-2b7e-4f52-a0a4-5b0d1f7e9c00","direction":"outbound","status":"completed","outcome":null,"outcome_code":null,"disposition":"interested",
  "from_number":"+14155550100","to_number":"+442071838750","started_at":"2026-11-22T10:00:00+00:00","answered_at":"2026-11-22T10:00:05+00:00","ended_at":"2026-11-22T10:02:05+00:00",
  "duration_seconds":120,"attempt_number":1,"campaign_id":"3b2a1c0d-1111-4222-8333-444455556666","agent":{"id":"9a8b7c6d-1111-4222-8333-444455556666","name":"Ava"},
  "contact":{"id":"c0ffee00-1111-4222-8333-444455556666","name":"Margarethe Quist","phone":"+442071838750","email":"m.quist@quistfamily.example.org","custom_fields":{"city":"Llanfairpwll","age":61,"vip":true}},
  "variables":{"crm_ref":"CRM-88213","contact":"c0ffee00-1111-4222-8333-444455556666"}},
 "data":{"event":"room_finished","room":{"name":"call-+442071838750","sid":"RM_x"}},
 "analysis":{"summary":"Margarethe Quist wants the blue plan","short_summary":"Wants blue plan","sentiment":"positive","lead_score":0.9,"disposition":"interested",
  "extracted_responses":[{"question":"Which plan?","variableName":"plan","answer":"the blue plan please","weight":1}]},
 "media":{"recording_url":"https://media.example.net/rec/abc.mp3?sig=Zk9v","transcript_url":"https://media.example.net/tr/abc.txt?sig=Zk9v","expires_in":3600}}`

// originals are the values of the personal fields of personal.
var originals = []string{"+14155550100", "+442071838750", "c0ffee00-1111-4222-8333-444455556666", "Margarethe Quist", "m.quist@quistfamily.example.org",
	"Llanfairpwll", "CRM-88213", "Margarethe Quist wants the blue plan", "Wants blue plan", "the blue plan please",
	"https://media.example.net/rec/abc.mp3?sig=Zk9v", "https://media.example.net/tr/abc.txt?sig=Zk9v"}

// The documented personal fields get stand-ins of their form, the same
// value the same stand-in, in this body and the next; the rest is kept,
// byte for byte, and still passes the contract checks.
func TestRedactorReplacesPersonalFields(t *testing.T) {
	r, err := NewRedactor([]string{"data.room.sid"})
	if err != nil {
		t.Fatal(err)
	}
	r.Learn([]byte(personal))
	out := r.Body([]byte(personal))
	for _, v := range originals {
		if strings.Contains(string(out), v) {
			t.Errorf("%q is still in the body:\n%s", v, out)
		}
	}
	for _, kept := range []string{`"call_id":"6f1c1c7e-2b7e-4f52-a0a4-5b0d1f7e9c00"`, `"question":"Which plan?"`, `"agent":{"id":"9a8b7c6d-1111-4222-8333-444455556666","name":"Ava"}`, `"vip":true`, `"lead_score":0.9`} {
		if !strings.Contains(string(out), kept) {
			t.Errorf("%s is gone:\n%s", kept, out)
		}
	}
	var p struct {
		Call struct {
			FromNumber string `json:"from_number"`
			To         string `json:"to_number"`
			Contact    struct {
				ID, Name, Phone, Email string
				CustomFields           map[string]any `json:"custom_fields"`
			}
			Variables map[string]string
		}
		Data struct {
			Room struct{ Name, Sid string }
		}
		Media struct {
			RecordingURL string `json:"recording_url"`
		}
	}
	if err := json.Unmarshal(out, &p); err != nil {
		t.Fatalf("the redacted body is not JSON: %v\n%s", err, out)
	}
	c := p.Call.Contact
	if !IsPhoneNumber(p.Call.FromNumber) || !IsPhoneNumber(c.Phone) || c.Phone != p.Call.To || p.Call.FromNumber == c.Phone {
		t.Errorf("numbers %q %q %q: want E.164 stand-ins, the contact's the same as to_number", p.Call.FromNumber, p.Call.To, c.Phone)
	}
	if !IsUUID(c.ID) || p.Call.Variables["contact"] != c.ID || !strings.Contains(c.Email, "@") || !strings.HasPrefix(p.Media.RecordingURL, "https://") {
		t.Errorf("contact %+v, variables %v, link %q: the forms are lost or the same id differs", c, p.Call.Variables, p.Media.RecordingURL)
	}
	if p.Data.Room.Name != "call-"+c.Phone || p.Data.Room.Sid == "RM_x" {
		t.Errorf("data.room %+v: the number inside the room's name or the --redact-path field was not replaced", p.Data.Room)
	}
	for _, f := range Check(out) {
		if f.Severity == SevError {
			t.Errorf("the redacted body fails the contract: %+v", f)
		}
	}
	// The same values in another body get the same stand-ins.
	if again := r.Body([]byte(personal)); string(again) != string(out) {
		t.Errorf("a second body got other stand-ins:\n%s\n%s", out, again)
	}
	if _, err := NewRedactor([]string{"call..x"}); err == nil {
		t.Error("a path with an empty key was taken")
	}
}
