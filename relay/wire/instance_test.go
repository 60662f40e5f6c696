package wire_test

import (
	"testing"

	"github.com/calltap/calltap/relay/wire"
)

func TestInstanceOrder(t *testing.T) {
	early := wire.Instance{Start: 100, ID: "ff"}
	late := wire.Instance{Start: 200, ID: "00"}
	tieLow := wire.Instance{Start: 200, ID: "0a"}
	for _, c := range []struct {
		name     string
		a, b     wire.Instance
		aIsOlder bool
	}{
		{"earlier start", early, late, true},
		{"later start", late, early, false},
		{"tie broken by id", late, tieLow, true},
		{"the same run", late, late, false},
		{"a run that did not say", wire.Instance{}, late, false},
		{"beside a run that did not say", early, wire.Instance{}, false},
	} {
		if got := c.a.OlderThan(c.b); got != c.aIsOlder {
			t.Errorf("%s: OlderThan = %v, want %v", c.name, got, c.aIsOlder)
		}
	}
}

func TestInstanceHeaderRoundTrip(t *testing.T) {
	in := wire.NewInstance()
	if in.IsZero() || in.Start <= 0 || in.ID == "" {
		t.Fatalf("NewInstance = %+v", in)
	}
	if other := wire.NewInstance(); other.ID == in.ID {
		t.Error("two runs got one id")
	}
	out, err := wire.ParseInstance(in.String())
	if err != nil || out != in {
		t.Fatalf("ParseInstance(%q) = %+v, %v; want %+v", in.String(), out, err, in)
	}
	for _, bad := range []string{"", "123", "x.ab", "-5.ab", "123."} {
		if _, err := wire.ParseInstance(bad); err == nil {
			t.Errorf("ParseInstance(%q) took it", bad)
		}
	}
}
