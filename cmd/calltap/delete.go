package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/calltap/calltap/storage"
)

// Retention defaults: a month of history, which a developer expects to find
// after restarts and weekends, in at most 5 GiB, which a laptop's disk does
// not miss. 0 turns either limit off.
const (
	defaultRetain   = 30 * 24 * time.Hour
	defaultMaxStore = 5 << 30
	retainEvery     = 10 * time.Minute // how often the agent prunes
)

// retentionFlags are listen's and dev's --retain, --max-store, --prune-kept.
type retentionFlags struct {
	retain   durationDays
	maxStore byteSize
	kept     bool
}

func (f *retentionFlags) register(fs *flagSet) {
	f.retain, f.maxStore = durationDays(defaultRetain), byteSize(defaultMaxStore)
	fs.Var(&f.retain, "retain", "prune captures older than this, e.g. 30d, 72h; 0 keeps them for ever")
	fs.Var(&f.maxStore, "max-store", "prune the oldest captures while the data directory's store is larger, e.g. 5GiB, 500MB; 0: no limit")
	fs.BoolVar(&f.kept, "prune-kept", false, "prune captures marked to keep and imported fixtures too")
}

func (f *retentionFlags) retention() storage.Retention {
	return storage.Retention{MaxAge: time.Duration(f.retain), MaxBytes: int64(f.maxStore), PruneKept: f.kept}
}

// runRetention is the agent's background pruner: a part of the app that
// runs until ctx ends (see storage.Retention).
func runRetention(db *storage.AgentStore, r storage.Retention, log *slog.Logger) func(context.Context) error {
	return func(ctx context.Context) error {
		db.RunRetention(ctx, r, retainEvery, log)
		<-ctx.Done() // with no limit set it returns at once: a part that ends ends the app
		return nil
	}
}

// durationDays is a time.Duration flag that also takes days ("30d").
type durationDays time.Duration

func (d *durationDays) String() string {
	if *d != 0 && time.Duration(*d)%(24*time.Hour) == 0 {
		return fmt.Sprintf("%dd", time.Duration(*d)/(24*time.Hour))
	}
	return time.Duration(*d).String()
}

func (d *durationDays) Set(s string) error {
	if n, ok := strings.CutSuffix(s, "d"); ok {
		days, err := strconv.ParseUint(n, 10, 16)
		if err != nil {
			return fmt.Errorf("want a duration such as 30d or 72h")
		}
		*d = durationDays(time.Duration(days) * 24 * time.Hour)
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil || v < 0 {
		return fmt.Errorf("want a duration such as 30d or 72h")
	}
	*d = durationDays(v)
	return nil
}

// byteSize is a size flag: bytes, or with a unit (KB, MB, GB, KiB, MiB, GiB, TiB).
type byteSize int64

var sizeUnits = []struct {
	suffix string
	n      int64
}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"B", 1}}

func (b *byteSize) String() string {
	for _, u := range sizeUnits[:4] {
		if *b != 0 && int64(*b)%u.n == 0 {
			return fmt.Sprintf("%d%s", int64(*b)/u.n, u.suffix)
		}
	}
	return strconv.FormatInt(int64(*b), 10)
}

func (b *byteSize) Set(s string) error {
	num, mult := strings.TrimSpace(s), int64(1)
	for _, u := range sizeUnits {
		if n, ok := strings.CutSuffix(num, u.suffix); ok {
			num, mult = strings.TrimSpace(n), u.n
			break
		}
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v < 0 || v*float64(mult) > 1<<62 {
		return fmt.Errorf("want a size such as 5GiB or 500MB")
	}
	*b = byteSize(v * float64(mult))
	return nil
}

func cmdDelete(ctx context.Context, args []string, stdio Stdio) int {
	fs := newFlagSet("delete", "calltap delete ID... | --call-id ID | --before TIME [--yes] [--data DIR]",
		"Delete captures from the local store, with their search entries, bodies and saved media. Works while the agent runs.\nTIME is RFC 3339 (2026-11-01T00:00:00Z), a date (2026-11-01) or an age (30d, 72h). --before leaves captures\nmarked to keep and imported fixtures unless --include-kept.")
	var (
		dataDir     = fs.String("data", defaultDataDir(), "data directory")
		callID      = fs.String("call-id", "", "delete every capture of this call, and its saved media")
		before      = fs.String("before", "", "delete every capture saved before TIME")
		yes         = fs.Bool("yes", false, "do not ask")
		includeKept = fs.Bool("include-kept", false, "with --before: delete kept and imported captures too")
	)
	if ok, code := parseFlags(fs, args, stdio); !ok {
		return code
	}
	modes := 0
	for _, set := range []bool{len(fs.args) > 0, *callID != "", *before != ""} {
		if set {
			modes++
		}
	}
	if modes != 1 {
		return usageError(stdio, "delete", "want capture IDs, --call-id or --before (one of them)")
	}
	var cutoff time.Time
	what := fmt.Sprintf("%d capture(s)", len(fs.args))
	if *callID != "" {
		what = "every capture of call " + *callID
	}
	if *before != "" {
		t, err := parseBefore(*before, time.Now())
		if err != nil {
			return usageError(stdio, "delete", "--before: %v", err)
		}
		cutoff, what = t, "every capture saved before "+t.Format(time.RFC3339)
	}
	if !*yes {
		if !isTerminal(stdio.In) {
			return usageError(stdio, "delete", "not a terminal: add --yes to delete %s", what)
		}
		fmt.Fprintf(stdio.Out, "Delete %s from %s? [y/N] ", what, *dataDir)
		line, _ := bufio.NewReader(stdio.In).ReadString('\n')
		if a := strings.ToLower(strings.TrimSpace(line)); a != "y" && a != "yes" {
			fmt.Fprintln(stdio.Out, "Nothing deleted.")
			return 1
		}
	}
	db, err := agentDB(ctx, *dataDir)
	if err != nil {
		return fail(stdio, "delete", err)
	}
	defer db.Close()
	var d storage.Deleted
	switch {
	case *callID != "":
		d, err = db.DeleteCall(ctx, *callID)
	case *before != "":
		d, err = db.DeleteBefore(ctx, cutoff, *includeKept)
	default:
		d, err = db.DeleteCaptures(ctx, fs.args...)
	}
	if err != nil {
		return fail(stdio, "delete", err)
	}
	if len(fs.args) > 0 && d.Captures < len(fs.args) {
		fmt.Fprintf(stdio.Err, "calltap delete: %d of %d IDs matched no capture\n", len(fs.args)-d.Captures, len(fs.args))
	}
	fmt.Fprintf(stdio.Out, "Deleted %d capture(s) and %d media file(s).\n", d.Captures, d.Media)
	if len(fs.args) > 0 && d.Captures < len(fs.args) {
		return 1
	}
	return 0
}

// parseBefore reads --before: RFC 3339, a date (midnight UTC) or an age.
func parseBefore(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t, nil
	}
	var age durationDays
	if err := age.Set(s); err == nil {
		return now.Add(-time.Duration(age)), nil
	}
	return time.Time{}, fmt.Errorf("%q: want RFC 3339, a date (2026-11-01) or an age (30d)", s)
}

func cmdKeep(ctx context.Context, args []string, stdio Stdio) int {
	fs := newFlagSet("keep", "calltap keep ID... [--off] [--data DIR]",
		"Mark captures to keep: retention (--retain, --max-store) never prunes them; calltap delete still can.")
	var (
		dataDir = fs.String("data", defaultDataDir(), "data directory")
		off     = fs.Bool("off", false, "remove the mark instead")
	)
	if ok, code := parseFlags(fs, args, stdio); !ok {
		return code
	}
	if len(fs.args) == 0 {
		return usageError(stdio, "keep", "want one or more capture IDs")
	}
	db, err := agentDB(ctx, *dataDir)
	if err != nil {
		return fail(stdio, "keep", err)
	}
	defer db.Close()
	for _, id := range fs.args {
		if err := db.SetKeep(ctx, id, !*off); errors.Is(err, storage.ErrNotFound) {
			return fail(stdio, "keep", fmt.Errorf("no capture %s in %s", id, *dataDir))
		} else if err != nil {
			return fail(stdio, "keep", err)
		}
	}
	return 0
}
