package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/calltap/calltap/inspector"
	"github.com/calltap/calltap/storage"
)

func cmdExport(ctx context.Context, args []string, stdio Stdio) int {
	fs := newFlagSet("export", "calltap export [--call-id ID]… [--event KIND] [--since 2h] [--q TEXT] [--format jsonl|har] [-o FILE] [--progress] [--data DIR]",
		"Write captures byte-exact, oldest first: as JSON Lines (a first line naming the format and its version, then one\ncapture a line as the inspector's API details it), or as HAR 1.2 for browsers' developer tools and HTTP tools.\nWithout -o, to standard output. Progress shows on stderr when it is a terminal, or with --progress.")
	var (
		dataDir = fs.String("data", defaultDataDir(), "data directory")
		callIDs stringList
		event   = fs.String("event", "", "only this event kind, e.g. call.ended")
		since   = fs.Duration("since", 0, "only captures of the last d, e.g. 2h")
		text    = fs.String("q", "", "full-text search in bodies")
		out     = fs.String("o", "", "file to write (written whole or not at all)")
		format  = fs.String("format", "jsonl", "jsonl (calltap import reads it back) or har")
		showAll = fs.Bool("progress", false, "a line on stderr every 1,000 captures and at the end, even when stderr is not a terminal")
	)
	fs.Var(&callIDs, "call-id", "only this call (repeatable)")
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
	f := storage.CaptureFilter{Event: *event, CallIDs: callIDs, Text: *text}
	if *since > 0 {
		f.Since = time.Now().Add(-*since)
	}
	db, path, err := readAgentDB(ctx, *dataDir)
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
		if _, n, err := db.Captures(ctx, storage.CaptureFilter{CallID: id, Page: storage.Page{Limit: 1}}); err != nil {
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
	w, commit := stdio.Out, func() error { return nil }
	if *out != "" {
		tmp, err := os.CreateTemp(filepath.Dir(*out), "."+filepath.Base(*out)+".*")
		if err != nil {
			return fail(stdio, "export", err)
		}
		defer os.Remove(tmp.Name()) // gone by then unless the export failed
		w, commit = tmp, func() error {
			if err := tmp.Close(); err != nil {
				return err
			}
			return os.Rename(tmp.Name(), *out)
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
	export := inspector.Export
	if *format == "har" {
		export = func(ctx context.Context, db *storage.AgentStore, f storage.CaptureFilter, w io.Writer, progress func(int)) (int, error) {
			return inspector.ExportHAR(ctx, db, f, version, w, progress)
		}
	}
	n, err := export(ctx, db, f, w, progress)
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
	fs := newFlagSet("import", "calltap import FILE [--data DIR]",
		"Load an export into the local store, byte-exact and marked as imported. Captures the store already holds (by id)\nare left as they are, so importing twice adds nothing; a file with a bad line imports nothing.")
	dataDir := fs.String("data", defaultDataDir(), "data directory")
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
	cs, err := inspector.ReadExport(file)
	if err != nil {
		return fail(stdio, "import", fmt.Errorf("%s: %w", fs.args[0], err))
	}
	db, err := agentDB(ctx, *dataDir)
	if err != nil {
		return fail(stdio, "import", err)
	}
	defer db.Close()
	n, err := inspector.Import(ctx, db, cs)
	if err != nil {
		return fail(stdio, "import", err)
	}
	fmt.Fprintf(stdio.Out, "imported %d of %d captures (%d already in the store)\n", n, len(cs), len(cs)-n)
	return 0
}
