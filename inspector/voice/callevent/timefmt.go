package callevent

import (
	"errors"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// TimeLayout is how generated payloads write timestamps: ISO 8601 with
// microseconds and an explicit numeric offset ("+00:00" rather than "Z"),
// as the documentation asks for "a timestamp with offset".
const TimeLayout = "2006-01-02T15:04:05.000000-07:00"

// FormatTime writes t in TimeLayout, in UTC.
func FormatTime(t time.Time) string { return t.UTC().Format(TimeLayout) }

// isoRE matches the ISO 8601 date-time forms seen in practice: extended
// date, T, hours and minutes, optional seconds and fraction, optional zone
// (Z, ±hh:mm, ±hhmm or ±hh).
var isoRE = regexp.MustCompile(`^(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2})(?::(\d{2})(?:[.,](\d+))?)?([Zz]|[+-]\d{2}(?::?\d{2})?)?$`)

// ErrNoOffset is returned by ParseTime with a usable time (read as UTC)
// when the timestamp carries no offset.
var ErrNoOffset = errors.New("timestamp has no offset")

// ParseTime parses an ISO 8601 date-time. A timestamp without an offset is
// read as UTC and returned with ErrNoOffset, so callers can order events
// and still report the fault.
func ParseTime(s string) (time.Time, error) {
	m := isoRE.FindStringSubmatch(s)
	if m == nil {
		return time.Time{}, errors.New("not an ISO 8601 date-time")
	}
	num := func(i int) int { n, _ := strconv.Atoi(m[i]); return n } // "" (no seconds) is 0
	year, month, day, hour, minute, sec := num(1), num(2), num(3), num(4), num(5), num(6)
	if !validDateTime(year, month, day, hour, minute, sec) {
		return time.Time{}, errors.New("date or time out of range")
	}
	loc, err := zone(m[8])
	if loc == nil {
		return time.Time{}, err
	}
	// A leap second is folded into the next second, as time.Date does.
	return time.Date(year, time.Month(month), day, hour, minute, sec, fraction(m[7]), loc), err
}

// fraction is the nanoseconds of a fraction of a second's digits (beyond
// nine, cut off).
func fraction(f string) int {
	if len(f) > 9 {
		f = f[:9]
	}
	nsec, _ := strconv.Atoi(f)
	for i := len(f); i < 9; i++ {
		nsec *= 10
	}
	return nsec
}

// validDateTime reports whether the fields name a real date and time; a
// leap second (60) is allowed.
func validDateTime(year, month, day, hour, minute, sec int) bool {
	return month >= 1 && month <= 12 && day >= 1 && day <= daysIn(year, month) && hour <= 23 && minute <= 59 && sec <= 60
}

// zone is the location of a timestamp's zone: UTC for Z, a fixed offset
// for ±hh:mm, ±hhmm or ±hh, and UTC with ErrNoOffset for none. An offset
// out of range is a nil location and an error.
func zone(z string) (*time.Location, error) {
	switch z {
	case "":
		return time.UTC, ErrNoOffset
	case "Z", "z":
		return time.UTC, nil
	}
	h, _ := strconv.Atoi(z[1:3])
	mins, _ := strconv.Atoi(strings.TrimPrefix(z[3:], ":")) // "" (±hh) is 0
	if h > 23 || mins > 59 {
		return nil, errors.New("offset out of range")
	}
	off := h*3600 + mins*60
	if z[0] == '-' {
		off = -off
	}
	return time.FixedZone("", off), nil
}

func daysIn(year, month int) int {
	return time.Date(year, time.Month(month)+1, 0, 0, 0, 0, 0, time.UTC).Day()
}
