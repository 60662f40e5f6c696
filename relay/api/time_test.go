package api

import (
	"testing"
	"time"
)

func TestTime(t *testing.T) {
	if Time(time.Time{}) != nil {
		t.Error("the zero time should be null")
	}
	at := time.Date(2025, 3, 14, 16, 12, 40, 120000789, time.FixedZone("", 3600))
	if s := Time(at); s == nil || *s != "2025-03-14T15:12:40.120000Z" {
		t.Errorf("Time = %v, want 2025-03-14T15:12:40.120000Z", s)
	}
}
