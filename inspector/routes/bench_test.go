package routes

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// analysisEvent is a call.analysis_completed delivery as the service's
// documentation describes it (the call block, analysis and media), about
// 2 KB: the largest of a call's events.
const analysisEvent = `{"id":"8d1f5a6e-3c2b-4e7f-9a10-2b3c4d5e6f70","event":"call.analysis_completed","occurred_at":"2026-11-22T10:04:31+00:00",
"call":{"call_id":"6f1c1c7e-2b7e-4f52-a0a4-5b0d1f7e9c00","direction":"outbound","status":"completed","outcome":"answered","outcome_code":null,"disposition":"interested",
"from_number":"+14155550100","to_number":"+14155550199","started_at":"2026-11-22T10:00:00+00:00","answered_at":"2026-11-22T10:00:07+00:00","ended_at":"2026-11-22T10:03:12+00:00",
"duration_seconds":185,"attempt_number":1,"campaign_id":"0c9e8d7f-6a5b-4c3d-8e2f-1a0b9c8d7e6f","agent":{"id":"5e4d3c2b-1a09-4f8e-b7d6-c5b4a3928170","name":"Ava"},
"contact":{"id":"a1b2c3d4-e5f6-4a7b-8c9d-0e1f2a3b4c5d","name":"Jordan Lee","phone":"+14155550199","email":"jordan.lee@example.com","custom_fields":{"plan":"pro","region":"us-west","account":"AC-20931"}},
"variables":{"developer":"alice","order_id":"ORD-77812","ticket":"T-5521","locale":"en-US"}},
"analysis":{"summary":"The customer confirmed the delivery window for next Tuesday and asked for an SMS reminder the day before. They were interested in upgrading to the annual plan and asked about the discount for paying upfront, which the agent explained.",
"short_summary":"Delivery confirmed for Tuesday; interested in annual plan.","sentiment":"positive","lead_score":0.82,"disposition":"interested",
"extracted_responses":[{"question":"Is next Tuesday between 9 and 12 a good delivery window?","variableName":"delivery_ok","answer":"yes","weight":1},
{"question":"Would you like a reminder the day before?","variableName":"reminder","answer":"yes, by SMS","weight":0.5},
{"question":"Are you interested in the annual plan?","variableName":"annual_interest","answer":"yes, if there is a discount","weight":0.8}]},
"media":{"recording_url":"https://media.example.com/rec/6f1c1c7e-2b7e-4f52-a0a4-5b0d1f7e9c00.ogg?X-Amz-Signature=5f2b9c0e7d4a1b3c6e8f0a2d4c6e8b0a2c4e6f8a0b2d4f6a8c0e2a4c6e8a0b2d&X-Amz-Expires=3600",
"transcript_url":"https://media.example.com/tr/6f1c1c7e-2b7e-4f52-a0a4-5b0d1f7e9c00.json?X-Amz-Signature=9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b&X-Amz-Expires=3600","expires_in":3600},
"data":{"event":"egress_ended","room":{"sid":"RM_7fK2pQ9xL4","name":"call-6f1c1c7e"}}}`

// tenRoutes is a file of ten routes of every kind, none of which takes
// analysisEvent before the last: Match tries them all.
func tenRoutes() string {
	var b strings.Builder
	for i := range 9 {
		switch i % 3 {
		case 0:
			fmt.Fprintf(&b, "[[route]]\nname = \"dev%d\"\nmatch = { \"call.variables.developer\" = \"dev%d\" }\nforward-to = \"http://127.0.0.1:%d\"\n", i, i, 3000+i)
		case 1:
			fmt.Fprintf(&b, "[[route]]\nname = \"kind%d\"\nevents = [\"call.connected\", \"call.recording_*\"]\nheader = { \"X-Team\" = \"t%d\" }\nforward-to = \"http://127.0.0.1:%d\"\n", i, i, 3000+i)
		default:
			fmt.Fprintf(&b, "[[route]]\nname = \"camp%d\"\nmatch = { \"call.campaign_id\" = \"c%d\", \"call.contact.custom_fields.region\" = \"*\" }\npath = \"/c%d/*\"\nforward-to = \"http://127.0.0.1:%d\"\n", i, i, i, 3000+i)
		}
	}
	b.WriteString("[[route]]\nname = \"alice\"\nevents = [\"call.*\"]\nmatch = { \"call.variables.developer\" = \"alice\" }\nforward-to = \"http://127.0.0.1:3100\"\n")
	return b.String()
}

func BenchmarkMatch10Routes(b *testing.B) {
	tb, err := Parse("routes.toml", []byte(tenRoutes()), WithCallValues(NewMemory()))
	if err != nil {
		b.Fatal(err)
	}
	req := Request{Body: []byte(analysisEvent), Header: http.Header{"Content-Type": {"application/json"}, "X-Team": {"core"}}, Path: "/hooks/voice"}
	if d := tb.Match(req); d.Name() != "alice" || d.CallID != "6f1c1c7e-2b7e-4f52-a0a4-5b0d1f7e9c00" {
		b.Fatalf("%+v", d)
	}
	b.SetBytes(int64(len(req.Body)))
	b.ReportAllocs()
	for b.Loop() {
		tb.Match(req)
	}
}
