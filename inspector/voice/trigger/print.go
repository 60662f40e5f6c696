package trigger

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// WriteTable writes what a run sent to url for a person at a terminal:
// the call, then a line for each delivery with what came back.
func (r Result) WriteTable(w io.Writer, url string) {
	fmt.Fprintf(w, "call %s -> %s\n", r.CallID, url)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "EVENT\tDELIVERY ID\tCAPTURE ID\tSTATUS\tDURATION\tNOTE")
	for _, d := range r.Deliveries {
		status := "-"
		if d.Status > 0 {
			status = fmt.Sprint(d.Status)
		}
		note := d.Error
		if d.Copy > 1 {
			note = strings.TrimSpace("duplicate " + note)
		}
		capture := d.CaptureID
		if capture == "" {
			capture = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.1f ms\t%s\n", d.Event, d.DeliveryID, capture, status, d.DurationMS, note)
	}
	tw.Flush()
}
