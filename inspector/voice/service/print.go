package service

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// How deliveries read for a person at a terminal (calltap service
// deliveries and delivery): the times in local time, a dash for what the
// log leaves empty.

// WriteDeliveries writes ds as a table, a delivery a line, and their count.
func WriteDeliveries(w io.Writer, ds []Delivery) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tCREATED\tEVENT\tCALL\tSTATUS\tATTEMPTS\tRESPONSE")
	for _, d := range ds {
		created := "-"
		if !d.CreatedAt.IsZero() {
			created = d.CreatedAt.Local().Format(time.DateTime)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d/%d\t%s\n", d.ID, created, dash(d.Event), dash(d.CallID), dash(d.Status),
			d.Attempts, d.MaxAttempts, statusOr(d.ResponseStatus, "-"))
	}
	tw.Flush()
	fmt.Fprintf(w, "%d deliveries\n", len(ds))
}

// WriteDelivery writes one delivery record, a field a line, with its
// attempts; of its payload only the size (calltap service delivery
// --payload prints the bytes).
func WriteDelivery(w io.Writer, d *Delivery) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "id\t%s\nevent\t%s\ncall\t%s\nurl\t%s\nstatus\t%s after %d of %d attempts\nresponse\t%s\n",
		d.ID, dash(d.Event), dash(d.CallID), d.URL, dash(d.Status), d.Attempts, d.MaxAttempts, statusOr(d.ResponseStatus, "no answer"))
	if d.Error != "" {
		fmt.Fprintf(tw, "error\t%s\n", d.Error)
	}
	for _, a := range d.AttemptLog {
		fmt.Fprintf(tw, "attempt %d\t%s  %s  %s\n", a.N, a.At.Local().Format("2006-01-02 15:04:05.000"), statusOr(a.ResponseStatus, "-"), a.Error)
	}
	fmt.Fprintf(tw, "payload\t%d bytes (--payload prints them)\n", len(d.Payload))
	tw.Flush()
}

// statusOr is an HTTP status as text, or none when there is no status.
func statusOr(status *int, none string) string {
	if status == nil {
		return none
	}
	return fmt.Sprint(*status)
}

// dash is s, or "-" for an empty field.
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
