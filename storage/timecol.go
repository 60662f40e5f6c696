package storage

import (
	"database/sql"
	"time"
)

// Every schema keeps a moment as an integer of unix microseconds, UTC, and
// an optional one as NULL when it is absent: these are the two directions
// of that column for the packages under storage.

// Micros is t as a nullable unix-µs column: NULL for the zero time.
func Micros(t time.Time) sql.NullInt64 {
	if t.IsZero() {
		return sql.NullInt64{}
	}
	return sql.NullInt64{Int64: t.UnixMicro(), Valid: true}
}

// FromMicros reads a nullable unix-µs column: the zero time for NULL.
func FromMicros(n sql.NullInt64) time.Time {
	if !n.Valid {
		return time.Time{}
	}
	return time.UnixMicro(n.Int64).UTC()
}
