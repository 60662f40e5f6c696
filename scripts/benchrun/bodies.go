package main

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"strings"

	"github.com/calltap/calltap/inspector/voice/callevent"
)

// jsonEvent2K is a call.ended event of the voice service, padded in
// call.variables to exactly 2048 bytes. stamp is the offset of the last 12
// hex digits of its delivery id, which the load generator rewrites per
// request so every delivery is distinct, as the service's are.
//
// It carries no links: the agent downloads the media links of events it
// captures, and the suite must never reach beyond loopback.
func jsonEvent2K() (body []byte, stamp int) {
	const size = 2048
	var p callevent.Payload
	for _, e := range (callevent.CallSpec{MediaBaseURL: "http://media.invalid"}).Events() {
		if e.Event == callevent.KindEnded {
			p = e
		}
	}
	for pad := 0; ; {
		p.Call.Variables = map[string]any{"lead_id": "L-1001", "notes": strings.Repeat("n", pad)}
		b, err := json.Marshal(p)
		if err != nil {
			panic(err) // a payload built by callevent always marshals
		}
		if bytes.Contains(b, []byte("://")) {
			panic("the sample event carries a link")
		}
		if len(b) == size {
			return b, bytes.Index(b, []byte(p.ID)) + 24
		}
		if len(b) > size {
			panic("the sample event is larger than 2 KB")
		}
		pad += size - len(b)
	}
}

// binaryBody is n bytes that are not UTF-8 text (so the agent does not
// full-text index them): an upload, not an event.
func binaryBody(n int) []byte {
	r := rand.New(rand.NewPCG(1, 2))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	b[0] = 0xff // never valid UTF-8
	return b
}
