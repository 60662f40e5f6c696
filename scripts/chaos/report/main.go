// Command report re-checks a saved chaos run: it reads the run's folder
// (package history), judges it with the checker (package check), writes the
// HTML report and prints the verdict and the page's path.
//
//	go run ./scripts/chaos/report [-o FILE] DIR
//
// It exits 0 when the run kept every safety promise, 1 when it did not or
// the folder could not be read, 2 on a usage error.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/calltap/calltap/scripts/chaos/check"
	"github.com/calltap/calltap/scripts/chaos/history"
)

const usage = "usage: report [-o FILE] DIR (DIR: a chaos run's folder, e.g. bin/chaos/team-42)"

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("report", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	out := fs.String("o", "", "where to write the page (default DIR/report.html)")
	if err := fs.Parse(args); err != nil || fs.NArg() != 1 {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stdout, usage)
			return 0
		}
		fmt.Fprintln(stderr, usage)
		return 2
	}
	dir := fs.Arg(0)
	if *out == "" {
		*out = filepath.Join(dir, "report.html")
	}
	h, err := history.Read(dir)
	if err != nil {
		fmt.Fprintln(stderr, "report:", err)
		return 1
	}
	r := check.Check(h)
	if err := check.WriteReport(*out, h, r); err != nil {
		fmt.Fprintln(stderr, "report:", err)
		return 1
	}
	fmt.Fprintln(stdout, r.Summary(10))
	fmt.Fprintln(stdout, "report:", *out)
	if !r.OK() {
		return 1
	}
	return 0
}
