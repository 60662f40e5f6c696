package agent

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// How a backfill reads for a person at a terminal (calltap backfill):
// its progress on one line, and what it did.

// Line is p on one status line; forward says whether the backfill sends
// what it imports on to the handler.
func (p BackfillProgress) Line(forward bool) string {
	s := fmt.Sprintf("backfill: %d pages walked (%d of %d deliveries)", p.Pages, p.Listed, p.Count)
	if p.Phase != "listing" {
		s += fmt.Sprintf(", %d missing, %d fetched, %d imported", p.Missing, p.Fetched, p.Imported)
		if forward {
			s += fmt.Sprintf(", %d forwarded", p.Forwarded)
		}
	}
	return s
}

// WriteReport writes what a backfill over the window since (0: the whole
// log) did: a line for each delivery that had not reached the agent, then
// the counts.
func (r BackfillResult) WriteReport(w io.Writer, since time.Duration, forward bool) {
	if len(r.Items) > 0 {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "DELIVERY\tEVENT\tCALL\tCAPTURE\tRESULT")
		for _, it := range r.Items {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", it.DeliveryID, dashed(it.Event), dashed(it.CallID), dashed(it.CaptureID), it.result())
		}
		tw.Flush()
	}
	window := "in the whole log"
	if since > 0 {
		window = "from the last " + shortDuration(since)
	}
	fmt.Fprintf(w, "%d deliveries %s: %d already here, %d imported", r.Listed, window, r.Known, r.Imported)
	if forward {
		fmt.Fprintf(w, " (%d forwarded, %d answered 2xx)", r.Forwarded, r.Delivered)
	}
	if r.NotSent > 0 {
		fmt.Fprintf(w, ", %d not sent yet", r.NotSent)
	}
	if r.Failed > 0 {
		fmt.Fprintf(w, ", %d could not be imported", r.Failed)
	}
	fmt.Fprintln(w)
}

// result says what became of it: imported (and what the handler
// answered, when forwarded), or why not.
func (it BackfillItem) result() string {
	switch {
	case it.CaptureID == "":
		return it.Error
	case it.ResponseStatus != nil && it.Error == "":
		return fmt.Sprintf("imported, handler %d", *it.ResponseStatus)
	case it.Error != "":
		return "imported, handler: " + it.Error
	}
	return "imported"
}

// dashed is s, or "-" for an empty field.
func dashed(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// shortDuration writes 2h rather than 2h0m0s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
