package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
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

// openRelayAdmin opens a relay's state: in NATS with --nats, else in the
// data directory's SQLite.
func openRelayAdmin(ctx context.Context, nf *natsFlags, dataDir string) (relayAdmin, func(), error) {
	if nf.urls != "" {
		c, err := nf.open(ctx, nil, slog.New(slog.DiscardHandler))
		if err != nil {
			return nil, nil, err
		}
		return c, func() { c.Close() }, nil
	}
	sdb, err := relayDB(ctx, dataDir)
	if err != nil {
		return nil, nil, err
	}
	return sdb, func() { sdb.Close() }, nil
}

// claimsCmd is calltap relay claims [release] and its flags.
type claimsCmd struct {
	release bool
	dataDir string
	asJSON  bool
	nf      natsFlags
	token   string     // release --token: the seat's token, by name
	claims  stringList // release --claim: the seat's claims
}

const claimsHelp = `List the seats of a relay's tokens: each agent that claims calls (calltap listen --claim), and each token's
default agent when it has requests queued. --json prints one array; each seat has token, tunnel_id, seat,
claims (empty for the default), agent (connected, away or unknown), away_since (RFC 3339, or null), queued and
calls_last_hour (calls whose first event came to the seat in the last hour).
'release' removes a claimant's seat, named by its id or by --token NAME and its --claim flags, with the
requests queued for it; its agent, if connected, is sent away.`

func cmdRelayClaims(ctx context.Context, args []string, stdio Stdio) int {
	c := claimsCmd{release: len(args) > 0 && args[0] == "release"}
	name := "relay claims"
	if c.release {
		name, args = name+" release", args[1:]
	}
	fs := newFlagSet(name, "calltap relay claims [--json]  |  calltap relay claims release SEAT | --token NAME --claim EXPR…  (--data DIR | --nats URLS)", claimsHelp)
	fs.StringVar(&c.dataDir, "data", defaultDataDir(), "the relay's data `dir`ectory")
	fs.BoolVar(&c.asJSON, "json", false, "print JSON")
	c.nf.register(fs, false)
	if c.release {
		fs.StringVar(&c.token, "token", "", "the `name` of the token whose seat to release, with its --claim flags")
		fs.Var(&c.claims, "claim", "a claim of the seat to release, as its agent gave it (`EXPR`; repeatable)")
	}
	if ok, code := parseFlags(fs, args, stdio); !ok {
		return code
	}
	return exitCode(stdio, name, c.run(ctx, fs.args, stdio))
}

func (c *claimsCmd) run(ctx context.Context, args []string, stdio Stdio) error {
	seat, claims, err := c.check(args)
	if err != nil {
		return err
	}
	db, closeDB, err := openRelayAdmin(ctx, &c.nf, c.dataDir)
	if err != nil {
		return err
	}
	defer closeDB()
	if !c.release {
		now := time.Now()
		l, err := claim.ReadListing(ctx, db, now)
		if err != nil {
			return err
		}
		if c.asJSON {
			return json.NewEncoder(stdio.Out).Encode(l)
		}
		return l.WriteTable(stdio.Out, now)
	}
	if seat == "" {
		if seat, err = claim.ResolveSeat(ctx, db, c.token, claims); err != nil {
			return err
		}
	}
	return c.releaseSeat(ctx, db, seat, stdio)
}

// check checks the arguments against each other; for release, it returns
// the seat named, or the claims of the seat to find.
func (c *claimsCmd) check(args []string) (seat string, claims claim.Set, err error) {
	if err := c.nf.validate(); err != nil {
		return "", nil, usagef("%v", err)
	}
	switch {
	case !c.release && len(args) > 0:
		return "", nil, usagef("unexpected argument %q", args[0])
	case !c.release:
		return "", nil, nil
	case len(args) > 1:
		return "", nil, usagef("unexpected argument %q", args[1])
	case len(args) == 1 && (c.token != "" || len(c.claims) > 0):
		return "", nil, usagef("name the seat by its id or by --token and --claim, not both")
	case len(args) == 1:
		return args[0], nil, nil
	case c.token == "" || len(c.claims) == 0:
		return "", nil, usagef("give a SEAT (calltap relay claims lists them), or --token NAME and the seat's --claim flags")
	}
	if claims, err = claim.ParseSet(c.claims); err != nil {
		return "", nil, usagef("--%v", err)
	}
	return "", claims, nil
}

func (c *claimsCmd) releaseSeat(ctx context.Context, db relayAdmin, seat string, stdio Stdio) error {
	n, err := db.ReleaseClaimant(ctx, seat)
	if errors.Is(err, relaystate.ErrNotFound) {
		return fmt.Errorf("no agent claims calls at seat %s (a token's default seat has nothing to release; calltap relay claims lists the seats)", seat)
	}
	if err != nil {
		return err
	}
	if c.asJSON {
		return json.NewEncoder(stdio.Out).Encode(map[string]any{"seat": seat, "released": true, "queued_dropped": n})
	}
	fmt.Fprintf(stdio.Out, "Released seat %s; %d queued requests went with it. Its agent, if connected, is sent away within seconds.\n", seat, n)
	return nil
}
