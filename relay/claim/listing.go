// The seats of a relay's tokens as `calltap relay claims` shows them: read
// from the relay's state, written as a table or as JSON.

package claim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/calltap/calltap/storage/relaystate"
)

// SeatID names the seat of an agent with claims s on token tunnelID: the
// tunnel id itself for the default agent (no claims), so that the
// default's queue is the tunnel's as it was before claims.
func SeatID(tunnelID string, s Set) string {
	if len(s) == 0 {
		return tunnelID
	}
	return tunnelID + "-" + s.Key()
}

// Tokens lists a relay's tokens.
type Tokens interface {
	Tokens(ctx context.Context) ([]*relaystate.Token, error)
}

// Registry is what a listing reads of a relay's state: its Store
// (relaydb's or the cluster's) has all of it.
type Registry interface {
	Tokens
	Claimants(ctx context.Context) ([]*relaystate.Claimant, error)
	QueueStatsByTunnel(ctx context.Context) (map[string]relaystate.QueueStats, error)
	CallsSince(ctx context.Context, since time.Time) (map[string]int, error)
}

// Agent states of a SeatRow.
const (
	AgentConnected = "connected"
	AgentAway      = "away"
	// AgentUnknown is the default seat's: the relay keeps no record of
	// whether the default agent is connected, only of its queue.
	AgentUnknown = "unknown"
)

// SeatRow is one seat of a Listing. Its JSON names are stable: scripts
// read them.
type SeatRow struct {
	Token    string   `json:"token"` // the token's name; its tunnel id for a seat whose token is gone
	TunnelID string   `json:"tunnel_id"`
	Seat     string   `json:"seat"`   // the tunnel id for the token's default seat
	Claims   []string `json:"claims"` // empty for the default seat
	Agent    string   `json:"agent"`  // connected, away or unknown (the default seat)
	// AwaySince is when an away claimant's agent left (or last came):
	// the seat is released --claim-ttl after it.
	AwaySince *time.Time `json:"away_since"`
	Queued    int        `json:"queued"`          // requests queued for the seat's agent
	Calls     int        `json:"calls_last_hour"` // calls whose first event came to this seat in the last hour
}

// Listing is every seat of every token: each token's default seat when it
// has claimants or a queue, then its claimants, oldest first; tokens by
// name.
type Listing []SeatRow

// ReadListing reads the seats of r's tokens as of now.
func ReadListing(ctx context.Context, r Registry, now time.Time) (Listing, error) {
	toks, err := r.Tokens(ctx)
	if err != nil {
		return nil, err
	}
	claimants, err := r.Claimants(ctx)
	if err != nil {
		return nil, err
	}
	queued, err := r.QueueStatsByTunnel(ctx)
	if err != nil {
		return nil, err
	}
	calls, err := r.CallsSince(ctx, now.Add(-time.Hour))
	if err != nil {
		return nil, err
	}
	names := map[string]string{}
	for _, t := range toks {
		names[t.TunnelID] = t.Name
	}
	l := Listing{}
	for _, c := range claimants {
		l = append(l, claimantRow(c, names))
	}
	for _, t := range toks {
		if t.RevokedAt == nil && (queued[t.TunnelID].Count > 0 || l.has(t.TunnelID)) {
			l = append(l, SeatRow{Token: t.Name, TunnelID: t.TunnelID, Seat: t.TunnelID, Claims: []string{}, Agent: AgentUnknown})
		}
	}
	for i := range l {
		l[i].Queued, l[i].Calls = queued[l[i].Seat].Count, calls[l[i].Seat]
	}
	l.sort(claimants)
	return l, nil
}

func claimantRow(c *relaystate.Claimant, names map[string]string) SeatRow {
	row := SeatRow{Token: names[c.TunnelID], TunnelID: c.TunnelID, Seat: c.Seat, Claims: c.Claims, Agent: AgentConnected}
	if row.Token == "" {
		row.Token = c.TunnelID
	}
	if !c.Connected {
		since := c.SeenAt
		row.Agent, row.AwaySince = AgentAway, &since
	}
	return row
}

// has reports whether a claimant seat of token tunnelID is listed.
func (l Listing) has(tunnelID string) bool {
	return slices.ContainsFunc(l, func(r SeatRow) bool { return r.TunnelID == tunnelID })
}

// sort orders l by token name, each token's default seat first, then its
// claimants in the order claimants lists them (the registry's: oldest
// first).
func (l Listing) sort(claimants []*relaystate.Claimant) {
	order := map[string]int{}
	for i, c := range claimants {
		order[c.Seat] = i + 1 // 0 for the default seat
	}
	slices.SortStableFunc(l, func(a, b SeatRow) int {
		if c := strings.Compare(a.Token, b.Token); c != 0 {
			return c
		}
		if c := strings.Compare(a.TunnelID, b.TunnelID); c != 0 {
			return c
		}
		return order[a.Seat] - order[b.Seat]
	})
}

// WriteTable writes l as columns, away times counted to now.
func (l Listing) WriteTable(w io.Writer, now time.Time) error {
	if len(l) == 0 {
		_, err := fmt.Fprintln(w, "No seats: no agent has claimed calls, and no token has requests queued.")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TOKEN\tSEAT\tCLAIMS\tAGENT\tQUEUED\tCALLS (1H)")
	for _, r := range l {
		claims := strings.Join(r.Claims, " ")
		if claims == "" {
			claims = "(default: what nobody claims)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\n", r.Token, r.Seat, claims, r.agentText(now), r.Queued, r.Calls)
	}
	return tw.Flush()
}

// agentText is the AGENT column: connected, away since when, or "-".
func (r SeatRow) agentText(now time.Time) string {
	switch {
	case r.Agent == AgentUnknown:
		return "-"
	case r.AwaySince == nil:
		return r.Agent
	}
	return fmt.Sprintf("away since %s (%s ago)", r.AwaySince.Local().Format(time.DateTime), roughly(now.Sub(*r.AwaySince)))
}

// roughly is d in its largest whole unit, as a reader weighs an absence
// against a TTL of days: 40s, 12m, 5h, 3d.
func roughly(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", max(int(d/time.Second), 0))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d/time.Hour))
	}
	return fmt.Sprintf("%dd", int(d/(24*time.Hour)))
}

// ErrNoSuchToken is ResolveSeat's answer for a name no active token has.
var ErrNoSuchToken = errors.New("no active token of that name")

// ResolveSeat returns the seat of the agent that claims s on the active
// token named token.
func ResolveSeat(ctx context.Context, r Tokens, token string, s Set) (string, error) {
	toks, err := r.Tokens(ctx)
	if err != nil {
		return "", err
	}
	for _, t := range toks {
		if t.Name == token && t.RevokedAt == nil {
			return SeatID(t.TunnelID, s), nil
		}
	}
	return "", fmt.Errorf("%w: %q", ErrNoSuchToken, token)
}
