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
	"strings"
	"time"
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
	fmt.Fprintf(os.Stderr, "  %-52s %s %s %s %s %s\n", x.Measure, x.Direct, x.Calltap, x.Ratio, x.Target, x.Met)
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

func printTable(w io.Writer, rows []row) {
	head := []string{"Measure", "Direct", "Through calltap", "calltap / direct", "Target", "Result"}
	cells := [][]string{head}
	met, total := 0, 0
	for _, x := range rows {
		cells = append(cells, []string{x.Measure, x.Direct, x.Calltap, x.Ratio, x.Target, x.Met})
		if x.Met != "" {
			total++
			if x.Met == "met" {
				met++
			}
		}
	}
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
	fmt.Fprintf(w, "\nTargets met: %d of %d.\n", met, total)
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
func failed(r loadResult) string {
	if bad := r.non2xx() + r.Errors; bad > 0 {
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
