package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/calltap/calltap/inspector"
	"github.com/calltap/calltap/storage"
	"github.com/calltap/calltap/storage/agentdb"
)

// Retention defaults: a month of history, which a developer expects to find
// after restarts and weekends, in at most 5 GiB, which a laptop's disk does
// not miss. 0 turns either limit off.
const (
	defaultRetain   = 30 * 24 * time.Hour
	defaultMaxStore = 5 << 30
	retainEvery     = 10 * time.Minute // how often the agent prunes at most
	retainEveryMin  = time.Second      // and at least: a prune that finds nothing costs one indexed query
)

// retainInterval is how often the agent prunes for r: a tenth of --retain,
// between retainEveryMin and retainEvery, so that a capture outlives its
// retention by at most a tenth of it (10 minutes for the default 30 days,
// 6 s for --retain 1m) rather than by a fixed 10 minutes.
func retainInterval(r agentdb.Retention) time.Duration {
	if r.MaxAge <= 0 {
		return retainEvery // --max-store alone: the store's size moves slowly
	}
	return min(retainEvery, max(retainEveryMin, r.MaxAge/10))
}

// retentionFlags are listen's and dev's --retain, --max-store, --prune-kept.
type retentionFlags struct {
	retain   durationDays
	maxStore byteSize
	kept     bool
}

func (f *retentionFlags) register(fs *flagSet) {
	f.retain, f.maxStore = durationDays(defaultRetain), byteSize(defaultMaxStore)
	fs.Var(&f.retain, "retain", "prune captures older than this `age`, e.g. 30d, 72h; 0 keeps them for ever")
	fs.Var(&f.maxStore, "max-store", "prune the oldest captures while the data directory's store is larger than `size`, e.g. 5GiB, 500MB; 0: no limit")
	fs.BoolVar(&f.kept, "prune-kept", false, "prune captures marked to keep and imported fixtures too")
}

func (f *retentionFlags) retention() agentdb.Retention {
	return agentdb.Retention{MaxAge: time.Duration(f.retain), MaxBytes: int64(f.maxStore), PruneKept: f.kept}
}

// runRetention is the agent's background pruner: a part of the app that
// runs until ctx ends (see agentdb.Retention).
func runRetention(db *agentdb.AgentStore, r agentdb.Retention, log *slog.Logger) func(context.Context) error {
	return func(ctx context.Context) error {
		db.RunRetention(ctx, r, retainInterval(r), log)
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
		"Delete captures from the local store, with their search entries, bodies and saved media. Works while the agent runs.\nID is a capture id, a unique prefix of one, or a delivery id (each of its captures). TIME is RFC 3339\n(2026-11-01T00:00:00Z), a date (2026-11-01) or an age (30d, 72h). --before leaves captures marked to keep and\nimported fixtures unless --include-kept. Without a terminal to ask on, it wants --yes.")
	var (
		dataDir     = fs.String("data", defaultDataDir(), "data `dir`ectory")
		callID      = fs.String("call-id", "", "delete every capture of the call `id`, and its saved media")
		before      = fs.String("before", "", "delete every capture saved before `time`")
		yes         = fs.Bool("yes", false, "do not ask")
		includeKept = fs.Bool("include-kept", false, "with --before: delete kept and imported captures too")
	)
	if ok, code := parseFlags(fs, args, stdio); !ok {
		return code
	}
	p, err := planDelete(fs.args, *callID, *before, *includeKept)
	if err == nil && !*yes && !isTerminal(stdio.In) {
		// A pipe, /dev/null, CI: nobody can answer, so nothing is asked.
		err = usagef("standard input is not a terminal: add --yes to delete without asking")
	}
	if err != nil {
		return exitCode(stdio, "delete", err)
	}
	db, err := agentDB(ctx, *dataDir)
	if err != nil {
		return fail(stdio, "delete", err)
	}
	defer db.Close()
	if len(fs.args) > 0 {
		// Every reference is read before anything goes: one that names
		// nothing (deleted already, mistyped) deletes nothing.
		if p.refs, err = resolveRefs(ctx, db, fs.args); err != nil {
			return fail(stdio, "delete", err)
		}
	}
	if !*yes && !confirm(stdio, fmt.Sprintf("Delete %s from %s?", p.what(), *dataDir)) {
		fmt.Fprintln(stdio.Out, "Nothing deleted.")
		return 1
	}
	d, err := p.run(ctx, db)
	if err != nil {
		return fail(stdio, "delete", err)
	}
	return p.report(stdio, d)
}

// planDelete checks that one way of choosing was given, and reads it.
func planDelete(ids []string, callID, before string, includeKept bool) (deletePlan, error) {
	p := deletePlan{callID: callID, includeKept: includeKept}
	modes := 0
	for _, set := range []bool{len(ids) > 0, callID != "", before != ""} {
		if set {
			modes++
		}
	}
	if modes != 1 {
		return p, usagef("want capture IDs, --call-id or --before (one of them)")
	}
	if before != "" {
		t, err := parseBefore(before, time.Now())
		if err != nil {
			return p, usagef("--before: %v", err)
		}
		p.cutoff = t
	}
	return p, nil
}

// report says what was deleted; deleting nothing of what was named exits 1.
func (p deletePlan) report(stdio Stdio, d agentdb.Deleted) int {
	if d.Captures == 0 && d.Media == 0 && !p.cutoff.IsZero() {
		fmt.Fprintf(stdio.Out, "Nothing saved before %s to delete.\n", p.cutoff.Format(time.RFC3339))
		return 0 // a routine prune that found nothing: no error
	}
	if d.Captures == 0 && d.Media == 0 {
		fmt.Fprintf(stdio.Err, "calltap delete: %s matched nothing; nothing deleted\n", p.what())
		return 1
	}
	fmt.Fprintf(stdio.Out, "Deleted %d capture(s) and %d media file(s).\n", d.Captures, d.Media)
	for _, r := range p.refs {
		if note := refNote(r, "deleted them all"); note != "" {
			fmt.Fprintln(stdio.Out, note)
		}
	}
	return 0
}

// deletePlan is what one calltap delete deletes: the captures refs name,
// a call, or what was saved before cutoff.
type deletePlan struct {
	refs        []inspector.CaptureRef
	callID      string
	cutoff      time.Time
	includeKept bool
}

// what names the plan for the prompt and the messages.
func (p deletePlan) what() string {
	switch {
	case p.callID != "":
		return "every capture of call " + p.callID
	case !p.cutoff.IsZero():
		return "every capture saved before " + p.cutoff.Format(time.RFC3339)
	}
	return fmt.Sprintf("%d capture(s)", len(p.ids()))
}

// ids are the captures refs name, each once: a delivery id stands for
// all of its captures (duplicates and replays), since they are one event.
func (p deletePlan) ids() []string {
	var ids []string
	for _, r := range p.refs {
		for _, id := range r.IDs() {
			if !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
	}
	return ids
}

func (p deletePlan) run(ctx context.Context, db *agentdb.AgentStore) (agentdb.Deleted, error) {
	switch {
	case p.callID != "":
		return db.DeleteCall(ctx, p.callID)
	case !p.cutoff.IsZero():
		return db.DeleteBefore(ctx, p.cutoff, p.includeKept)
	}
	return db.DeleteCaptures(ctx, p.ids()...)
}

// confirm asks a person at a terminal; only y or yes is a yes.
func confirm(stdio Stdio, question string) bool {
	fmt.Fprintf(stdio.Out, "%s [y/N] ", question)
	line, _ := bufio.NewReader(stdio.In).ReadString('\n')
	a := strings.ToLower(strings.TrimSpace(line))
	return a == "y" || a == "yes"
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
		"Mark captures to keep: retention (--retain, --max-store) never prunes them; calltap delete still can.\nID is a capture id, a unique prefix of one, or a delivery id (each of its captures).")
	var (
		dataDir = fs.String("data", defaultDataDir(), "data `dir`ectory")
		off     = fs.Bool("off", false, "remove the mark instead")
	)
	if ok, code := parseFlags(fs, args, stdio); !ok {
		return code
	}
	if len(fs.args) == 0 {
		return usageError(stdio, "keep", "want one or more capture IDs")
	}
	db, refs, err := openResolved(ctx, *dataDir, fs.args)
	if err != nil {
		return fail(stdio, "keep", err)
	}
	defer db.Close()
	p := deletePlan{refs: refs}
	for _, id := range p.ids() {
		if err := db.SetKeep(ctx, id, !*off); errors.Is(err, storage.ErrNotFound) {
			return fail(stdio, "keep", fmt.Errorf("capture %s was deleted meanwhile", id))
		} else if err != nil {
			return fail(stdio, "keep", err)
		}
	}
	done := "Kept (retention will not prune)"
	if *off {
		done = "Let go (retention may prune again)"
	}
	fmt.Fprintf(stdio.Out, "%s %d capture(s): %s\n", done, len(p.ids()), strings.Join(p.ids(), ", "))
	return 0
}
