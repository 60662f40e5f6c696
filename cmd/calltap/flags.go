package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/calltap/calltap/storage"
)

// flagSet is a flag.FlagSet that knows its usage line and description.
type flagSet struct {
	*flag.FlagSet
	usageLine   string
	description string
	required    []string
	args        []string // positional arguments, wherever they stood
}

func newFlagSet(name, usageLine, description string) *flagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return &flagSet{FlagSet: fs, usageLine: usageLine, description: description}
}

// require marks flags that must be given.
func (fs *flagSet) require(names ...string) { fs.required = append(fs.required, names...) }

// parseFlags parses args. -h prints the flags to stdout (ok=false, code 0);
// a bad or missing flag prints one line to stderr (ok=false, code 2).
func parseFlags(fs *flagSet, args []string, stdio Stdio) (ok bool, code int) {
	// Flags may follow positional arguments ("token create alice --data
	// DIR"): parse, take one positional, parse the rest again.
	var err error
	fs.args = nil
	for {
		if err = fs.Parse(args); err != nil || fs.NArg() == 0 {
			break
		}
		rest := fs.Args()
		if rest[0] == "--" {
			fs.args = append(fs.args, rest[1:]...)
			break
		}
		fs.args = append(fs.args, rest[0])
		args = rest[1:]
	}
	if errors.Is(err, flag.ErrHelp) {
		printFlags(fs, stdio.Out)
		return false, 0
	}
	if err != nil {
		fmt.Fprintf(stdio.Err, "calltap %s: %v (see 'calltap %s -h')\n", fs.Name(), err, fs.Name())
		return false, 2
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for _, name := range fs.required {
		if !set[name] {
			fmt.Fprintf(stdio.Err, "calltap %s: missing required flag --%s (see 'calltap %s -h')\n", fs.Name(), name, fs.Name())
			return false, 2
		}
	}
	return true, 0
}

func printFlags(fs *flagSet, w io.Writer) {
	fmt.Fprintf(w, "Usage: %s\n\n%s\n", fs.usageLine, fs.description)
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	if n == 0 {
		return
	}
	fmt.Fprintln(w, "\nFlags:")
	fs.VisitAll(func(f *flag.Flag) {
		name, help := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if name != "" {
			line += " " + name
		}
		fmt.Fprintf(w, "%s\n    \t%s", line, strings.ReplaceAll(help, "\n", "\n    \t"))
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" && f.DefValue != "[]" {
			fmt.Fprintf(w, " (default %s)", f.DefValue)
		}
		fmt.Fprintln(w)
	})
}

// usageError prints one line and returns 2.
func usageError(stdio Stdio, cmd, format string, args ...any) int {
	fmt.Fprintf(stdio.Err, "calltap %s: %s (see 'calltap %s -h')\n", cmd, fmt.Sprintf(format, args...), cmd)
	return 2
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ", ") }
func (l *stringList) Set(s string) error { *l = append(*l, s); return nil }

// syncFlag is --sync: how durable the data directory's commits are.
type syncFlag struct{ mode storage.SyncMode }

func (f *syncFlag) register(fs *flagSet) {
	fs.Var(f, "sync", "durability `mode`: full: what is acknowledged is on disk before the answer (survives a power cut);\nnormal: synced at checkpoints only, faster, a power cut may lose the last acknowledged requests")
}

func (f *syncFlag) String() string {
	if f.mode == "" {
		return string(storage.SyncFull)
	}
	return string(f.mode)
}

func (f *syncFlag) Set(s string) error {
	m, err := storage.ParseSyncMode(s)
	if err != nil {
		return err
	}
	f.mode = m
	return nil
}

// syncMode is the flag's value: storage.SyncFull if it was not given.
func (f *syncFlag) syncMode() storage.SyncMode {
	if f.mode == "" {
		return storage.SyncFull
	}
	return f.mode
}

// defaultDataDir is $XDG_DATA_HOME/calltap or ~/.local/share/calltap.
func defaultDataDir() string {
	if d := os.Getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "calltap")
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".local", "share", "calltap")
	}
	return ".calltap"
}

// usageErr is a mistake in the command line: a command's check returns it,
// and exitCode says it on one line and exits 2.
type usageErr struct{ msg string }

func (e *usageErr) Error() string { return e.msg }

// usagef makes a usageErr.
func usagef(format string, args ...any) error {
	return &usageErr{msg: fmt.Sprintf(format, args...)}
}

// exitCode reports how cmd ended: 0 for nil, a usage error on one line and
// 2, any other error on one line and 1.
func exitCode(stdio Stdio, cmd string, err error) int {
	var u *usageErr
	switch {
	case err == nil:
		return 0
	case errors.As(err, &u):
		return usageError(stdio, cmd, "%s", u.msg)
	}
	return fail(stdio, cmd, err)
}
