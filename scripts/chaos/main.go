// Command chaos checks calltap's promise as a whole, the way Jepsen checks
// a database: it starts a real topology from the built binary, every part
// a separate process (three NATS servers in a JetStream cluster, three
// relay nodes, and four agents sharing one token: three claimants and the
// default; with -single one relay and one agent, and with -claims the four
// agents there too), sends
// it traffic as the voice service would, injects faults from a schedule
// drawn from a seed (signals, network faults through an embedded
// toxiproxy, a full disk, a power cut), records every answer and every
// request the handler received, reads the agent's store once the run has
// drained, and hands the history to the checker (scripts/chaos/check).
//
//	make chaos [CHAOS_MINUTES=3] [CHAOS_SEED=42] [CHAOS_ARGS=--single] [CHAOS_BIN=path/to/calltap]
//	go run ./scripts/chaos -bin bin/calltap -nats-server bin/nats-server [-minutes 3] [-seed 42] [-single] [-claims=BOOL] [-out DIR]
//
// It prints the verdict in one line and the report's path, and exits 1 when
// the run broke a safety promise (or could not run), 2 on a usage error.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/calltap/calltap/scripts/chaos/history"
)

const usage = "usage: chaos -bin CALLTAP -nats-server NATS_SERVER [-minutes M] [-seed N] [-single] [-claims=BOOL] [-out DIR]"

// config is one run's settings.
type config struct {
	minutes float64
	seed    int64
	single  bool
	claims  bool   // claimant agents share the token with the default one
	bin     string // calltap, as built
	natsBin string // nats-server (team mode)
	out     string // the run's folder
}

func main() {
	os.Exit(mainCode(os.Args[1:], os.Stdout, os.Stderr))
}

func mainCode(args []string, stdout, stderr io.Writer) int {
	cfg, err := parseArgs(args)
	if err != nil {
		fmt.Fprintln(stderr, "chaos:", err)
		fmt.Fprintln(stderr, usage)
		return 2
	}
	// The first Ctrl-C stops the run in order (children stopped, the
	// agent's disk unmounted); from then on a second one kills at once.
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	go func() { <-ctx.Done(); cancel() }()
	res, err := run(ctx, cfg, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "chaos:", err)
		return 1
	}
	fmt.Fprintln(stdout, res.verdict)
	fmt.Fprintln(stdout, "report:", res.report)
	if !res.ok {
		return 1
	}
	return 0
}

func parseArgs(args []string) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Float64Var(&cfg.minutes, "minutes", 3, "how long faults are injected and calls started")
	fs.Int64Var(&cfg.seed, "seed", 0, "the nemesis's and the traffic's seed (0: one from the clock, printed)")
	fs.BoolVar(&cfg.single, "single", false, "one relay and one agent instead of the team relay")
	var claims *bool
	fs.BoolFunc("claims", "claimant agents share the token with the default one (default: in team mode)", func(s string) error {
		b, err := strconv.ParseBool(s)
		claims = &b
		return err
	})
	fs.StringVar(&cfg.bin, "bin", "bin/calltap", "the calltap binary to test")
	fs.StringVar(&cfg.natsBin, "nats-server", "bin/nats-server", "the nats-server binary (team mode)")
	fs.StringVar(&cfg.out, "out", "", "the run's folder (default bin/chaos/<mode>-<seed>)")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	cfg.claims = !cfg.single
	if claims != nil {
		cfg.claims = *claims
	}
	if !(cfg.minutes > 0) {
		return cfg, errors.New("-minutes must be above 0")
	}
	if cfg.seed == 0 {
		cfg.seed = time.Now().UnixNano() % 1_000_000
	}
	if cfg.out == "" {
		cfg.out = filepath.Join("bin", "chaos", fmt.Sprintf("%s-%d", cfg.mode(), cfg.seed))
	}
	for _, b := range []*string{&cfg.bin, &cfg.natsBin} {
		abs, err := filepath.Abs(*b)
		if err != nil {
			return cfg, err
		}
		*b = abs
	}
	return cfg, nil
}

func (c config) mode() string {
	if c.single {
		return history.ModeSingle
	}
	return history.ModeTeam
}
