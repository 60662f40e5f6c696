package api

import "time"

// TimeLayout is how every calltap JSON API writes a time: RFC 3339 in UTC
// with microseconds, the precision the store keeps.
const TimeLayout = "2006-01-02T15:04:05.000000Z07:00"

// FormatTime writes t in TimeLayout, in UTC.
func FormatTime(t time.Time) string { return t.UTC().Format(TimeLayout) }

// Time is FormatTime(t) for a field that is null while unset: nil for the
// zero time.
func Time(t time.Time) *string {
	if t.IsZero() {
		return nil
	}
	s := FormatTime(t)
	return &s
}
