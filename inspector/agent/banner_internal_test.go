package agent

import (
	"strings"
	"testing"
	"time"

	"github.com/calltap/calltap/relay/polltest"
)

// The startup line about what the relay held says what the relay holds,
// never that all of it will be delivered: after a relay restart it can
// send requests this agent already saved, which the agent does not forward
// again (an agent printed "Delivering 195 requests" and delivered none).
func TestAwayLineSaysOnlyWhatWillBeDelivered(t *testing.T) {
	if got := awayLine(0); got != "" {
		t.Errorf("nothing held: %q, want no line", got)
	}
	got := awayLine(195)
	for _, want := range []string{"195", "held", "not already saved here"} {
		if !strings.Contains(got, want) {
			t.Errorf("%q lacks %q", got, want)
		}
	}
	if strings.Contains(got, "Delivering 195") {
		t.Errorf("%q promises every held request to the handler", got)
	}
}

// An agent with claims is told, at startup, what the relay holds its seat
// by and what it queued for it, in the same words as the default agent's
// away line; the default agent's lines are as before claims.
func TestBannerSaysWhatTheAgentClaims(t *testing.T) {
	var out strings.Builder
	b := Banner{Command: "listen", Version: "v1", PublicURL: "https://r/t/x", Destination: "http://127.0.0.1:3000",
		Claims: []string{"call.variables.developer=alice", "header:X-Dev=alice"}, Queued: 3}
	b.Print(&out)
	want := "calltap listen · v1\n  Tunnel     https://r/t/x  ->  http://127.0.0.1:3000\n" +
		"  Claims     call.variables.developer=alice or header:X-Dev=alice; the relay holds 3 requests queued for them; those not already saved here go to your handler first, in order\n\n"
	if out.String() != want {
		t.Errorf("banner:\n%s\nwant:\n%s", out.String(), want)
	}
	b.Queued = 0
	if got := b.seatLine(); !strings.HasSuffix(got, "alice; nothing queued for them") {
		t.Errorf("nothing queued: %q", got)
	}
	b.Claims, b.Queued, b.InspectorURL = nil, 2, "http://127.0.0.1:4040"
	out.Reset()
	b.Print(&out)
	if s := out.String(); strings.Contains(s, "Claims") || !strings.Contains(s, "  Inspector  http://127.0.0.1:4040\n"+awayLine(2)+"\n") {
		t.Errorf("the default agent's banner:\n%s", s)
	}
}

func TestRefusalReportSumsUpPerInterval(t *testing.T) {
	var out lockedBuffer
	r := NewRefusalReport(&out, 50*time.Millisecond)
	r.Note(0) // a connection's first state carries no count
	r.Note(1)
	for _, total := range []int64{3, 7, 7, 2, 9} { // 2: a count from before the relay restarted
		r.Note(total)
	}
	polltest.Until(t, 5*time.Second, func() bool { return strings.Count(out.String(), "\n") == 2 }, "no summary line")
	want := "  relay refused 1 request(s) without the required header\n" +
		"  relay refused 8 request(s) without the required header in the last 50ms\n"
	if out.String() != want {
		t.Errorf("console:\n%s\nwant:\n%s", out.String(), want)
	}
	r.Note(12)
	r.Stop()
	r.Note(20)
	want += "  relay refused 3 request(s) without the required header\n"
	if out.String() != want {
		t.Errorf("after stop:\n%s\nwant:\n%s", out.String(), want)
	}
}

func (l *lockedBuffer) String() string {
	s, _ := l.read()
	return s
}
