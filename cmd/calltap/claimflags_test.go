package main

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/calltap/calltap/relay/claim"
)

// --claim-ttl and --call-memory take Go's durations and days.
func TestDaysFlag(t *testing.T) {
	for in, want := range map[string]time.Duration{"7d": 7 * 24 * time.Hour, "36h": 36 * time.Hour, "1.5d": 36 * time.Hour, "90m": 90 * time.Minute} {
		var d days
		if err := d.Set(in); err != nil || time.Duration(d) != want {
			t.Errorf("%q: %v, %v; want %v", in, time.Duration(d), err, want)
		}
	}
	for d, want := range map[days]string{days(7 * 24 * time.Hour): "7d", days(24 * time.Hour): "24h", days(36 * time.Hour): "36h", days(90 * time.Minute): "1h30m0s"} {
		if got := d.String(); got != want {
			t.Errorf("%v prints %q, want %q", time.Duration(d), got, want)
		}
	}
}

// A claim that does not parse, or a bad bound of the relay's claims, is a
// usage error: one line naming the flag, exit 2, and nothing started (no
// data directory made).
func TestClaimFlagErrors(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	listen := []string{"listen", "--relay", "http://127.0.0.1:1", "--token", "t", "--forward-to", "http://127.0.0.1:3000", "--data", dir}
	dev := []string{"dev", "--forward-to", "http://127.0.0.1:3000", "--listen", "127.0.0.1:0", "--inspect", "", "--data", dir}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{append(listen, "--claim", "alice"), `--claim "alice": want PATH=VALUE`},
		{append(listen, "--claim", "call.variables.developer=alice", "--claim", "call..x=1"), `--claim "call..x=1"`},
		{append(listen, "--claim", "x="), "the value after = is empty"},
		{append(dev, "--claim", "header:a b=c"), `--claim "header:a b=c"`},
		{[]string{"relay", "--max-claims", "0", "--data", dir}, "--max-claims must be 1 or more"},
		{[]string{"relay", "--claim-ttl", "0", "--data", dir}, "-claim-ttl"},
		{[]string{"relay", "--claim-ttl", "-1d", "--data", dir}, "above zero"},
		{[]string{"relay", "--claim-ttl", "sevend", "--data", dir}, "a number of days"},
		{[]string{"relay", "--call-memory", "1y", "--data", dir}, "-call-memory"},
		{[]string{"relay", "claims", "extra", "--data", dir}, `unexpected argument "extra"`},
		{[]string{"relay", "claims", "release", "--data", dir}, "give a SEAT"},
		{[]string{"relay", "claims", "release", "s-1", "--token", "team", "--claim", "x=1", "--data", dir}, "not both"},
		{[]string{"relay", "claims", "release", "--token", "team", "--data", dir}, "give a SEAT"},
		{[]string{"relay", "claims", "release", "--token", "team", "--claim", "x", "--data", dir}, `--claim "x"`},
	} {
		code, stdout, stderr := runCmd(t, tc.args...)
		if code != 2 || stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2 and one line with %q", tc.args, code, stdout, stderr, tc.want)
		}
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("a refused command made its data directory (%v)", err)
	}
}

// relay claims -h names every field of its JSON, the fields a script
// reads.
func TestRelayClaimsHelpNamesItsJSON(t *testing.T) {
	code, stdout, _ := runCmd(t, "relay", "claims", "-h")
	if code != 0 {
		t.Fatalf("relay claims -h: exit %d", code)
	}
	row := reflect.TypeFor[claim.SeatRow]()
	for i := range row.NumField() {
		field, _, _ := strings.Cut(row.Field(i).Tag.Get("json"), ",")
		if !strings.Contains(stdout, field) {
			t.Errorf("relay claims -h does not name %s:\n%s", field, stdout)
		}
	}
	if code, stdout, _ := runCmd(t, "relay", "claims", "release", "-h"); code != 0 || !strings.Contains(stdout, "--token name") || !strings.Contains(stdout, "--claim EXPR") {
		t.Errorf("relay claims release -h: exit %d\n%s", code, stdout)
	}
}
