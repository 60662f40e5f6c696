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
	var (
		dataDir = fs.String("data", defaultDataDir(), "data `dir`ectory")
		callIDs stringList
		event   = fs.String("event", "", "only this event `kind`, e.g. call.ended")
		since   = fs.Duration("since", 0, "only captures of the last d, e.g. 2h")
		text    = fs.String("q", "", "full-text search in bodies for `words`")
		out     = fs.String("o", "", "`file` to write (written whole or not at all)")
		format  = fs.String("format", "jsonl", "output `format`: jsonl (calltap import reads it back) or har")
		showAll = fs.Bool("progress", false, "a line on stderr every 1,000 captures and at the end, even when stderr is not a terminal")
		secrets = fs.Bool("include-secrets", false, "keep the values of secret headers (Authorization, Cookie, …) as they came")
		redact  = fs.Bool("redact", false, "replace contact, numbers, variables, summaries, answers and media links with stand-ins")
		masks   stringList
		paths   stringList
	)
	fs.Var(&callIDs, "call-id", "only this call, by its `id` (repeatable)")
	fs.Var(&masks, "mask-header", "mask the values of the header `name` too (repeatable)")
	fs.Var(&paths, "redact-path", "with --redact: a JSON `path` of the body to replace too, e.g. call.contact.custom_fields.city or data.room.name (repeatable)")
	if ok, code := parseFlags(fs, args, stdio); !ok {
		return code
	}
	if len(fs.args) > 0 {
		return usageError(stdio, "export", "unexpected argument %q", fs.args[0])
	}
	if *format != "jsonl" && *format != "har" {
		return usageError(stdio, "export", "--format must be jsonl or har")
	}
	if *since < 0 {
		return usageError(stdio, "export", "--since must be positive")
	}
	if len(paths) > 0 && !*redact {
		return usageError(stdio, "export", "--redact-path goes with --redact")
	}
	if *secrets && len(masks) > 0 {
		return usageError(stdio, "export", "--mask-header and --include-secrets contradict each other")
	}
	for _, m := range masks {
		if m == "" || strings.ContainsAny(m, ": \t") {
			return usageError(stdio, "export", "--mask-header %q: want a header name", m)
		}
	}
	o := inspector.ExportOptions{}
	if *redact {
		r, err := callevent.NewRedactor(paths)
		if err != nil {
			return usageError(stdio, "export", "%v", err)
		}
		o.Redactor = r
	}
	f := agentdb.CaptureFilter{Event: *event, CallIDs: callIDs, Text: *text}
	if *since > 0 {
		f.Since = time.Now().Add(-*since)
	}
	db, path, err := readAgentDB(ctx, stdio, "export", *dataDir, *text != "")
	if err != nil {
		return fail(stdio, "export", err)
	}
	if db == nil {
		return fail(stdio, "export", errors.New(noStore(path)))
	}
	defer db.Close()
	// An unknown call or an empty selection is said before anything is
	// written.
	for _, id := range callIDs {
		if _, n, err := db.Captures(ctx, agentdb.CaptureFilter{CallID: id, Page: storage.Page{Limit: 1}}); err != nil {
			return fail(stdio, "export", err)
		} else if n == 0 {
			return fail(stdio, "export", fmt.Errorf("no capture of call %s in %s", id, *dataDir))
		}
	}
	if first, err := db.CapturesAfter(ctx, f, 0, 1); err != nil {
		return fail(stdio, "export", err)
	} else if len(first) == 0 {
		return fail(stdio, "export", errors.New("no capture matches: nothing to export"))
	}
	if !*secrets {
		required, err := requiredHeaderNames(*dataDir)
		if err != nil {
			return fail(stdio, "export", err)
		}
		o.Mask = maskList(inspector.SecretHeaders(), required, masks)
	}
	w, commit := stdio.Out, func() error { return nil }
	if *out != "" {
		// The file is written beside its place and renamed there, so
		// that it is whole or absent; a failure names the user's path,
		// not the temporary file's.
		tmp, err := os.CreateTemp(filepath.Dir(*out), "."+filepath.Base(*out)+".*")
		if err != nil {
			return fail(stdio, "export", pathError(*out, err))
		}
		defer os.Remove(tmp.Name()) // gone by then unless the export failed
		w, commit = tmp, func() error {
			if err := tmp.Close(); err != nil {
				return pathError(*out, err)
			}
			return pathError(*out, os.Rename(tmp.Name(), *out))
		}
	}
	// A terminal sees one line rewritten; with --progress, anything else
	// (a log, CI) gets a line every 1,000 captures and one at the end.
	// Otherwise stderr stays quiet, for scripts that read it.
	status := newStatusLine(stdio.Err)
	progress := func(n int) {
		switch {
		case status.on:
			status.show(fmt.Sprintf("exported %d captures…", n), false)
		case *showAll:
			fmt.Fprintf(stdio.Err, "calltap export: %d captures so far\n", n)
		}
	}
	o.Filter, o.Progress = f, progress
	export := inspector.Export
	if *format == "har" {
		export = func(ctx context.Context, db *agentdb.AgentStore, o inspector.ExportOptions, w io.Writer) (int, error) {
			return inspector.ExportHAR(ctx, db, o, version, w)
		}
	}
	n, err := export(ctx, db, o, w)
	if err != nil && *out != "" {
		err = pathError(*out, err)
	}
	status.done()
	if err == nil {
		err = commit()
	}
	if err != nil {
		return fail(stdio, "export", err)
	}
	if *out != "" {
		fmt.Fprintf(stdio.Err, "%d captures written to %s\n", n, *out)
	}
	return 0
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

// maskList is the header names to mask, each once (case aside), in the
// order given.
func maskList(lists ...[]string) []string {
	var out []string
	seen := map[string]bool{}
	for _, l := range lists {
		for _, name := range l {
			key := strings.ToLower(name)
			if !seen[key] {
				seen[key] = true
				out = append(out, name)
			}
		}
	}
	return out
}

// requiredHeadersFile, in the data directory, lists the names of the
// headers `listen --require-header` made senders present: their values are
// the senders' secrets, which an export masks. Names only, one a line.
const requiredHeadersFile = "required-headers"

// requiredHeaderNames reads requiredHeadersFile; none when it is absent.
func requiredHeaderNames(dataDir string) ([]string, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, requiredHeadersFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return strings.Fields(string(b)), nil
}

// recordRequiredHeaders adds the names of require ("Name: value") to
// requiredHeadersFile, keeping those of earlier runs: captures of those
// runs hold their values.
func recordRequiredHeaders(dataDir string, require []string) error {
	if len(require) == 0 {
		return nil
	}
	known, err := requiredHeaderNames(dataDir)
	if err != nil {
		return err
	}
	var names []string
	for _, r := range require {
		if name, _, ok := strings.Cut(r, ":"); ok && strings.TrimSpace(name) != "" {
			names = append(names, strings.TrimSpace(name))
		}
	}
	all := maskList(known, names)
	if len(all) == len(known) {
		return nil
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dataDir, requiredHeadersFile), []byte(strings.Join(all, "\n")+"\n"), 0o600)
}
