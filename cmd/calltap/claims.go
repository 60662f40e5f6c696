package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/calltap/calltap/relay"
	"github.com/calltap/calltap/relay/claim"
	"github.com/calltap/calltap/storage/relaystate"
)

// relayAdmin is a relay's state as its commands read and change it:
// tokens, and the seats of the agents that share them.
type relayAdmin interface {
	relay.TokenStore
	claim.Registry
	ReleaseClaimant(ctx context.Context, seat string) (int, error)
}

const claimsHelp = `List the seats of a relay's tokens: each agent that claims calls (calltap listen --claim), and each token's
default agent when it has requests queued. --json prints one array; each seat has token, tunnel_id, seat,
claims (empty for the default), agent (connected, away or unknown), away_since (RFC 3339, or null), queued and
calls_last_hour (calls whose first event came to the seat in the last hour).
'release' removes a claimant's seat, named by its id or by --token NAME and its --claim flags, with the
requests queued for it; its agent, if connected, is sent away.`

// claimsArgs are calltap relay claims' arguments and release's flags.
type claimsArgs struct {
	release bool
	args    []string
	token   string     // release --token: the seat's token, by name
	claims  stringList // release --claim: the seat's claims
}

// check checks the arguments against each other; for release, it returns
// the seat named, or the claims of the seat to find.
func (a *claimsArgs) check() (seat string, claims claim.Set, err error) {
	switch {
	case !a.release && len(a.args) > 0:
		return "", nil, usagef("unexpected argument %q", a.args[0])
	case !a.release:
		return "", nil, nil
	case len(a.args) > 1:
		return "", nil, usagef("unexpected argument %q", a.args[1])
	case len(a.args) == 1 && (a.token != "" || len(a.claims) > 0):
		return "", nil, usagef("name the seat by its id or by --token and --claim, not both")
	case len(a.args) == 1:
		return a.args[0], nil, nil
	case a.token == "" || len(a.claims) == 0:
		return "", nil, usagef("give a SEAT (calltap relay claims lists them), or --token NAME and the seat's --claim flags")
	}
	if claims, err = claim.ParseSet(a.claims); err != nil {
		return "", nil, usagef("--%v", err)
	}
	return "", claims, nil
}

// listSeats prints the seats of db's tokens, as a table or as JSON.
func listSeats(ctx context.Context, db relayAdmin, asJSON bool, stdio Stdio) error {
	now := time.Now()
	l, err := claim.ReadListing(ctx, db, now)
	if err != nil {
		return err
	}
	if asJSON {
		return json.NewEncoder(stdio.Out).Encode(l)
	}
	return l.WriteTable(stdio.Out, now)
}

// releaseSeat releases a claimant's seat, named by seat or else by the
// token and claims of a.
func releaseSeat(ctx context.Context, db relayAdmin, a *claimsArgs, seat string, claims claim.Set, asJSON bool, stdio Stdio) error {
	if seat == "" {
		var err error
		if seat, err = claim.ResolveSeat(ctx, db, a.token, claims); err != nil {
			return err
		}
	}
	n, err := db.ReleaseClaimant(ctx, seat)
	if errors.Is(err, relaystate.ErrNotFound) {
		return fmt.Errorf("no agent claims calls at seat %s (a token's default seat has nothing to release; calltap relay claims lists the seats)", seat)
	}
	if err != nil {
		return err
	}
	if asJSON {
		return json.NewEncoder(stdio.Out).Encode(map[string]any{"seat": seat, "released": true, "queued_dropped": n})
	}
	fmt.Fprintf(stdio.Out, "Released seat %s; %d queued requests went with it. Its agent, if connected, is sent away within seconds.\n", seat, n)
	return nil
}
