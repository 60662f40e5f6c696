package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/calltap/calltap/inspector"
	"github.com/calltap/calltap/inspector/voice/callevent"
	"github.com/calltap/calltap/storage"
	"github.com/calltap/calltap/storage/agentdb"
)

func cmdExport(ctx context.Context, args []string, stdio Stdio) int {
	fs := newFlagSet("export", "calltap export [--call-id ID]… [--event KIND] [--since 2h] [--q TEXT] [--format jsonl|har] [-o FILE] [--mask-header NAME]… [--include-secrets] [--redact [--redact-path PATH]…] [--progress] [--data DIR]",
		"Write captures byte-exact, oldest first: as JSON Lines (a first line naming the format, its version and what was\nmasked, then one capture a line as the inspector's API details it), or as HAR 1.2 for browsers' developer tools and\nHTTP tools. Without -o, to standard output. Progress shows on stderr when it is a terminal, or with --progress.\n\nThe values of secret headers are masked as "+inspector.MaskedValue+": "+strings.Join(inspector.SecretHeaders(), ", ")+",\nthose `listen --require-header` used with this data directory, and --mask-header; --include-secrets keeps them.\n--redact replaces the personal fields of call events with stand-ins (the same value, the same stand-in): for\nfixtures to share or commit.")
	var e exportCmd
	fs.StringVar(&e.dataDir, "data", defaultDataDir(), "data `dir`ectory")
	fs.StringVar(&e.event, "event", "", "only this event `kind`, e.g. call.ended")
	fs.DurationVar(&e.since, "since", 0, "only captures of the last d, e.g. 2h")
	fs.StringVar(&e.text, "q", "", "full-text search in bodies for `words`")
	fs.StringVar(&e.out, "o", "", "`file` to write (written whole or not at all)")
	fs.StringVar(&e.format, "format", "jsonl", "output `format`: jsonl (calltap import reads it back) or har")
	fs.BoolVar(&e.showAll, "progress", false, "a line on stderr every 1,000 captures and at the end, even when stderr is not a terminal")
	fs.BoolVar(&e.secrets, "include-secrets", false, "keep the values of secret headers (Authorization, Cookie, …) as they came")
	fs.BoolVar(&e.redact, "redact", false, "replace contact, numbers, variables, summaries, answers and media links with stand-ins")
	fs.Var(&e.callIDs, "call-id", "only this call, by its `id` (repeatable)")
	fs.Var(&e.masks, "mask-header", "mask the values of the header `name` too (repeatable)")
	fs.Var(&e.paths, "redact-path", "with --redact: a JSON `path` of the body to replace too, e.g. call.contact.custom_fields.city or data.room.name (repeatable)")
	if ok, code := parseFlags(fs, args, stdio); !ok {
		return code
	}
	return exitCode(stdio, "export", e.run(ctx, fs.args, stdio))
}

// exportCmd is calltap export's flags.
type exportCmd struct {
	dataDir, event, text, out, format string
	since                             time.Duration
	showAll, secrets, redact          bool
	callIDs, masks, paths             stringList
}

// check checks the flags against each other.
func (e *exportCmd) check(args []string) error {
	switch {
	case len(args) > 0:
		return usagef("unexpected argument %q", args[0])
	case e.format != "jsonl" && e.format != "har":
		return usagef("--format must be jsonl or har")
	case e.since < 0:
		return usagef("--since must be positive")
	case len(e.paths) > 0 && !e.redact:
		return usagef("--redact-path goes with --redact")
	case e.secrets && len(e.masks) > 0:
		return usagef("--mask-header and --include-secrets contradict each other")
	}
	for _, m := range e.masks {
		if m == "" || strings.ContainsAny(m, ": \t") {
			return usagef("--mask-header %q: want a header name", m)
		}
	}
	return nil
}

func (e *exportCmd) run(ctx context.Context, args []string, stdio Stdio) error {
	if err := e.check(args); err != nil {
		return err
	}
	o := inspector.ExportOptions{Filter: agentdb.CaptureFilter{Event: e.event, CallIDs: e.callIDs, Text: e.text}}
	if e.redact {
		r, err := callevent.NewRedactor(e.paths)
		if err != nil {
			return usagef("%v", err)
		}
		o.Redactor = r
	}
	if e.since > 0 {
		o.Filter.Since = time.Now().Add(-e.since)
	}
	db, err := openStoreToRead(ctx, stdio, "export", e.dataDir, e.text != "")
	if err != nil {
		return err
	}
	defer db.Close()
	if err := e.checkSelection(ctx, db, o.Filter); err != nil {
		return err
	}
	if !e.secrets {
		mask, err := inspector.ExportMask(e.dataDir, e.masks)
		if err != nil {
			return err
		}
		o.Mask = mask
	}
	return e.write(ctx, db, o, stdio)
}

// checkSelection says an unknown call or an empty selection before
// anything is written.
func (e *exportCmd) checkSelection(ctx context.Context, db *agentdb.AgentStore, f agentdb.CaptureFilter) error {
	for _, id := range e.callIDs {
		if _, n, err := db.Captures(ctx, agentdb.CaptureFilter{CallID: id, Page: storage.Page{Limit: 1}}); err != nil {
			return err
		} else if n == 0 {
			return fmt.Errorf("no capture of call %s in %s", id, e.dataDir)
		}
	}
	if first, err := db.CapturesAfter(ctx, f, 0, 1); err != nil {
		return err
	} else if len(first) == 0 {
		return errors.New("no capture matches: nothing to export")
	}
	return nil
}

// write writes the export to standard output or, with -o, to a file that
// is whole or absent.
func (e *exportCmd) write(ctx context.Context, db *agentdb.AgentStore, o inspector.ExportOptions, stdio Stdio) error {
	w, commit, cleanup, err := e.output(stdio)
	if err != nil {
		return err
	}
	defer cleanup()
	status := newStatusLine(stdio.Err)
	o.Progress = e.progress(status, stdio)
	export := inspector.Export
	if e.format == "har" {
		export = func(ctx context.Context, db *agentdb.AgentStore, o inspector.ExportOptions, w io.Writer) (int, error) {
			return inspector.ExportHAR(ctx, db, o, version, w)
		}
	}
	n, err := export(ctx, db, o, w)
	if err != nil && e.out != "" {
		err = pathError(e.out, err)
	}
	status.done()
	if err == nil {
		err = commit()
	}
	if err != nil {
		return err
	}
	if e.out != "" {
		fmt.Fprintf(stdio.Err, "%d captures written to %s\n", n, e.out)
	}
	return nil
}

// output is where the export goes, what makes it final, and what removes
// what a failed export left.
func (e *exportCmd) output(stdio Stdio) (w io.Writer, commit, cleanup func() error, err error) {
	nothing := func() error { return nil }
	if e.out == "" {
		return stdio.Out, nothing, nothing, nil
	}
	// The file is written beside its place and renamed there, so that it
	// is whole or absent; a failure names the user's path, not the
	// temporary file's.
	tmp, err := os.CreateTemp(filepath.Dir(e.out), "."+filepath.Base(e.out)+".*")
	if err != nil {
		return nil, nil, nil, pathError(e.out, err)
	}
	commit = func() error {
		if err := tmp.Close(); err != nil {
			return pathError(e.out, err)
		}
		return pathError(e.out, os.Rename(tmp.Name(), e.out))
	}
	// Gone by then unless the export failed.
	cleanup = func() error { return os.Remove(tmp.Name()) }
	return tmp, commit, cleanup, nil
}

// progress reports the count: a terminal sees one line rewritten; with
// --progress, anything else (a log, CI) gets a line every 1,000 captures
// and one at the end. Otherwise stderr stays quiet, for scripts that read
// it.
func (e *exportCmd) progress(status *statusLine, stdio Stdio) func(int) {
	return func(n int) {
		switch {
		case status.on:
			status.show(fmt.Sprintf("exported %d captures…", n), false)
		case e.showAll:
			fmt.Fprintf(stdio.Err, "calltap export: %d captures so far\n", n)
		}
	}
}

func cmdImport(ctx context.Context, args []string, stdio Stdio) int {
	fs := newFlagSet("import", "calltap import FILE [--data DIR] [--json]",
		"Load an export into the local store, byte-exact and marked as imported. Captures the store already holds (by id)\nare left as they are, so importing twice adds nothing; a file with a bad line imports nothing.")
	dataDir := fs.String("data", defaultDataDir(), "data `dir`ectory")
	asJSON := fs.Bool("json", false, "print {imported, total, already} as JSON")
	if ok, code := parseFlags(fs, args, stdio); !ok {
		return code
	}
	if len(fs.args) != 1 {
		return usageError(stdio, "import", "want one FILE, the export to load")
	}
	file, err := os.Open(fs.args[0])
	if err != nil {
		return fail(stdio, "import", err)
	}
	defer file.Close()
	ef, err := inspector.ReadExport(file)
	if err != nil {
		return fail(stdio, "import", fmt.Errorf("%s: %w", fs.args[0], err))
	}
	cs := ef.Captures
	db, err := agentDB(ctx, *dataDir)
	if err != nil {
		return fail(stdio, "import", err)
	}
	defer db.Close()
	n, err := inspector.Import(ctx, db, cs)
	if err != nil {
		return fail(stdio, "import", err)
	}
	if *asJSON {
		json.NewEncoder(stdio.Out).Encode(struct {
			Imported int `json:"imported"`
			Total    int `json:"total"`
			Already  int `json:"already"`
		}{n, len(cs), len(cs) - n})
		return 0
	}
	fmt.Fprintf(stdio.Out, "imported %d of %d captures (%d already in the store)\n", n, len(cs), len(cs)-n)
	return 0
}

// pathError names the file the user asked for in err, whatever file the
// error came from (the temporary one beside it).
func pathError(path string, err error) error {
	if err == nil {
		return nil
	}
	var pe *os.PathError
	var le *os.LinkError
	switch {
	case errors.As(err, &pe):
		err = pe.Err
	case errors.As(err, &le):
		err = le.Err
	}
	return fmt.Errorf("%s: %w", path, err)
}
