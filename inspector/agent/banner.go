// The agent's console lines beyond its line per request: the startup
// lines once the tunnel is first up, and the summary of senders the relay
// refused.

package agent

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// Banner is what the agent prints once its tunnel is first up: where
// requests come from and go, its inspector, and what the relay holds for
// its seat.
type Banner struct {
	Command      string // dev or listen
	Version      string
	PublicURL    string // where senders reach the tunnel, from the relay's hello
	Destination  string // where requests go, as the flags say
	InspectorURL string // "" without an inspector
	// Claims are what the relay holds this agent's seat by, from its
	// hello; none for the token's default agent.
	Claims []string
	Queued int // requests the relay holds for the seat
}

// Print writes the banner's lines and a blank line.
func (b *Banner) Print(w io.Writer) {
	fmt.Fprintf(w, "calltap %s · %s\n  Tunnel     %s  ->  %s\n", b.Command, b.Version, b.PublicURL, b.Destination)
	if b.InspectorURL != "" {
		fmt.Fprintf(w, "  Inspector  %s\n", b.InspectorURL)
	}
	if line := b.seatLine(); line != "" {
		fmt.Fprintln(w, line)
	}
	fmt.Fprintln(w)
}

// seatLine is the startup line about the agent's seat: for an agent with
// claims, what the relay holds them by and what it queued for them; for
// the token's default agent, awayLine.
func (b *Banner) seatLine() string {
	if len(b.Claims) == 0 {
		return awayLine(b.Queued)
	}
	held := "nothing queued for them"
	if b.Queued > 0 {
		held = fmt.Sprintf("the relay holds %d requests queued for them; %s", b.Queued, notSavedFirst)
	}
	return fmt.Sprintf("  Claims     %s; %s", strings.Join(b.Claims, " or "), held)
}

// notSavedFirst is what becomes of the requests the relay held. Some may
// already be saved here (a relay that restarted before it heard they
// were: the agent marks them and does not forward them again), so the
// startup line says what the relay holds, not that all of it goes to the
// handler; each one that does prints its own line.
const notSavedFirst = "those not already saved here go to your handler first, in order"

// awayLine is the default agent's startup line about what the relay held
// while it was away: n requests.
func awayLine(n int) string {
	if n <= 0 {
		return ""
	}
	return fmt.Sprintf("  Away       the relay held %d requests for you; %s", n, notSavedFirst)
}

// RefusalReportEvery is how often the console sums up refused senders.
const RefusalReportEvery = 10 * time.Second

// RefusalReport turns the relay's running count of senders refused for a
// missing --require-header into console lines: the first refusals at once,
// then at most one line per interval with the count since the last line,
// so that a flood of refusals prints a few lines, not one each.
type RefusalReport struct {
	out   io.Writer
	every time.Duration

	mu         sync.Mutex
	seen       int64       // guarded by mu: the relay's count last heard
	unreported int64       // guarded by mu: refusals not printed yet
	printedAt  time.Time   // guarded by mu: when the last line was printed
	timer      *time.Timer // guarded by mu: pending summary; nil when none
	stopped    bool        // guarded by mu
}

// NewRefusalReport reports to out, a line at most every interval.
func NewRefusalReport(out io.Writer, every time.Duration) *RefusalReport {
	return &RefusalReport{out: out, every: every}
}

// Note takes the relay's running count. The count only grows while the
// relay runs; a smaller one (a connection's first state, or a restarted
// relay) adds nothing.
func (r *RefusalReport) Note(total int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if total <= r.seen || r.stopped {
		return
	}
	r.unreported += total - r.seen
	r.seen = total
	if r.timer != nil {
		return // the summary due will carry these
	}
	if wait := time.Until(r.printedAt.Add(r.every)); wait > 0 {
		r.timer = time.AfterFunc(wait, r.summarise)
		return
	}
	r.printLocked("")
}

// summarise prints what came in since the last line, an interval ago.
func (r *RefusalReport) summarise() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.timer = nil
	if !r.stopped {
		r.printLocked(" in the last " + r.every.String())
	}
}

// Stop prints what was not reported yet and ends the summaries.
func (r *RefusalReport) Stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.timer != nil {
		r.timer.Stop()
		r.timer = nil
	}
	r.printLocked("")
	r.stopped = true
}

func (r *RefusalReport) printLocked(period string) {
	if r.unreported == 0 {
		return
	}
	fmt.Fprintf(r.out, "  relay refused %d request(s) without the required header%s\n", r.unreported, period)
	r.unreported = 0
	r.printedAt = time.Now()
}
