package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/calltap/calltap/scripts/benchrun/load"
)

// row is one line of the final table. Parts write rows as they measure, so
// a part that fails still leaves the others' numbers.
type row struct {
	Measure string `json:"measure"`
	Direct  string `json:"direct,omitempty"`
	Calltap string `json:"calltap"`
	Ratio   string `json:"ratio,omitempty"`
	Target  string `json:"target,omitempty"`
	Met     string `json:"met,omitempty"` // "met", "not met" or "" (no target)

	// A row of a table of its own (printed after the main one, under its
	// name as a heading): Cells are its columns before Target and Result.
	// Its Head row names them; a Note row is printed under the table.
	Table string   `json:"table,omitempty"`
	Head  bool     `json:"head,omitempty"`
	Cells []string `json:"cells,omitempty"`
	Note  string   `json:"note,omitempty"`
}

// results appends rows to the file given with --out (JSON lines).
type results struct {
	f *os.File
}

func openResults(path string) (*results, error) {
	if path == "" {
		return &results{}, nil
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &results{f: f}, nil
}

func (r *results) add(x row) {
	b, _ := json.Marshal(x)
	switch {
	case x.Table == "":
		fmt.Fprintf(os.Stderr, "  %-52s %s %s %s %s %s\n", x.Measure, x.Direct, x.Calltap, x.Ratio, x.Target, x.Met)
	case x.Note == "":
		fmt.Fprintf(os.Stderr, "  %s %s %s\n", strings.Join(x.Cells, " | "), x.Target, x.Met)
	}
	if r.f != nil {
		r.f.Write(append(b, '\n'))
	}
}

func (r *results) close() {
	if r.f != nil {
		r.f.Close()
	}
}

// verdict turns a comparison into the Met column.
func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "**not met**"
}

func cmdReport(args []string) error {
	fs := flag.NewFlagSet("report", flag.ContinueOnError)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("give the results file")
	}
	f, err := os.Open(fs.Arg(0))
	if err != nil {
		return err
	}
	defer f.Close()
	var rows []row
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var x row
		if err := json.Unmarshal(sc.Bytes(), &x); err != nil {
			return fmt.Errorf("results file: %w", err)
		}
		rows = append(rows, x)
	}
	if err := sc.Err(); err != nil {
		return err
	}
	printTable(os.Stdout, rows)
	return nil
}

// printTable prints the main table, then the tables of their own in the
// order they first appear, then how many targets of all were met.
func printTable(w io.Writer, rows []row) {
	head := []string{"Measure", "Direct", "Through calltap", "calltap / direct", "Target", "Result"}
	cells := [][]string{head}
	met, total := 0, 0
	var tables []string
	for _, x := range rows {
		if x.Met != "" && !x.Head {
			total++
			if x.Met == "met" {
				met++
			}
		}
		if x.Table != "" {
			if !slices.Contains(tables, x.Table) {
				tables = append(tables, x.Table)
			}
			continue
		}
		cells = append(cells, []string{x.Measure, x.Direct, x.Calltap, x.Ratio, x.Target, x.Met})
	}
	if len(cells) > 1 {
		printGrid(w, cells)
	}
	for _, t := range tables {
		printOwnTable(w, t, rows)
	}
	fmt.Fprintf(w, "\nTargets met: %d of %d.\n", met, total)
}

// printOwnTable prints the rows of table t: its first Head row names the
// columns (later ones, from a part run twice into one file, are skipped);
// Target and Result columns are added when a row has a target.
func printOwnTable(w io.Writer, t string, rows []row) {
	var head []string
	var body []row
	var notes []string
	targets := false
	for _, x := range rows {
		switch {
		case x.Table != t:
		case x.Head:
			if head == nil {
				head = x.Cells
			}
		case x.Note != "":
			if !slices.Contains(notes, x.Note) {
				notes = append(notes, x.Note)
			}
		default:
			body = append(body, x)
			targets = targets || x.Target != "" || x.Met != ""
		}
	}
	n := len(head)
	for _, x := range body {
		n = max(n, len(x.Cells))
	}
	line := func(c []string, target, result string) []string {
		c = append(slices.Clip(c), make([]string, n-len(c))...)
		if targets {
			c = append(c, target, result)
		}
		return c
	}
	cells := [][]string{line(head, "Target", "Result")}
	for _, x := range body {
		cells = append(cells, line(x.Cells, x.Target, x.Met))
	}
	fmt.Fprintf(w, "\n### %s\n\n", t)
	printGrid(w, cells)
	for _, note := range notes {
		fmt.Fprintf(w, "\n%s\n", note)
	}
}

// printGrid prints cells as a Markdown table; the first row is the head.
func printGrid(w io.Writer, cells [][]string) {
	head := cells[0]
	widths := make([]int, len(head))
	for _, c := range cells {
		for i, s := range c {
			widths[i] = max(widths[i], len([]rune(s)))
		}
	}
	line := func(c []string) {
		var b strings.Builder
		b.WriteString("|")
		for i, s := range c {
			b.WriteString(" " + s + strings.Repeat(" ", widths[i]-len([]rune(s))) + " |")
		}
		fmt.Fprintln(w, b.String())
	}
	line(cells[0])
	sep := make([]string, len(head))
	for i := range sep {
		sep[i] = strings.Repeat("-", widths[i])
	}
	line(sep)
	for _, c := range cells[1:] {
		line(c)
	}
}

// Formatting shared by the parts.

func fmtRate(perSec float64, unit string) string {
	return fmtThousands(perSec) + " " + unit
}

func fmtThousands(v float64) string {
	if v < 100 && v != math.Trunc(v) {
		return fmt.Sprintf("%.1f", v)
	}
	s := fmt.Sprintf("%.0f", math.Round(v))
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

func fmtCount(n int) string { return fmtThousands(float64(n)) }

func fmtDur(d time.Duration) string {
	switch {
	case d < 0:
		return "-" + fmtDur(-d)
	case d < 10*time.Microsecond:
		return fmt.Sprintf("%.1f µs", float64(d)/1e3)
	case d < time.Millisecond:
		return fmt.Sprintf("%.0f µs", float64(d)/1e3)
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.2f ms", float64(d)/1e6)
	case d < time.Second:
		return fmt.Sprintf("%.1f ms", float64(d)/1e6)
	default:
		return fmt.Sprintf("%.2f s", d.Seconds())
	}
}

// failed notes, after a rate, the requests of r that did not succeed.
func failed(r load.Result) string {
	if bad := r.Non2xx() + r.Errors; bad > 0 {
		return fmt.Sprintf(" (%d failed)", bad)
	}
	return ""
}

// fmtDelta is a difference of durations, signed: "+281 µs", "-1.29 ms".
func fmtDelta(d time.Duration) string {
	if d < 0 {
		return fmtDur(d)
	}
	return "+" + fmtDur(d)
}

func fmtBytes(n float64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", n/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", n/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", n/(1<<10))
	default:
		return fmt.Sprintf("%.0f B", n)
	}
}
