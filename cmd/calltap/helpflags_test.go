package main

import (
	"regexp"
	"strings"
	"testing"
)

// Every flag in every command's -h shows a placeholder that names what to
// give (flag.UnquoteUsage's back-quoted word), never a value that reads as
// the answer (--forward-timeout 504, --sync full) nor the bare type words
// "string" and "value" that say nothing.
func TestHelpPlaceholdersReadAsNames(t *testing.T) {
	var helps [][]string
	for name, c := range commands() {
		if c.run != nil {
			helps = append(helps, []string{name, "-h"})
		}
	}
	helps = append(helps, []string{"relay", "token", "create", "-h"}, []string{"service", "deliveries", "-h"},
		[]string{"service", "delivery", "-h"}, []string{"service", "replay", "-h"}, []string{"routes", "check", "-h"})
	flagLine := regexp.MustCompile(`^  --(\S+)(?: (.+))?$`)
	defaultIs := regexp.MustCompile(`\(default ([^)]*)\)$`)
	seen := 0
	for _, args := range helps {
		code, out, _ := runCmd(t, args...)
		if code != 0 {
			t.Errorf("%v: exit %d", args, code)
			continue
		}
		lines := strings.Split(out, "\n")
		for i, l := range lines {
			m := flagLine.FindStringSubmatch(l)
			if m == nil || m[2] == "" {
				continue
			}
			seen++
			name, ph := m[1], m[2]
			def := ""
			for _, h := range lines[i+1:] {
				if !strings.HasPrefix(h, "    \t") {
					break
				}
				if d := defaultIs.FindStringSubmatch(h); d != nil {
					def = d[1]
				}
			}
			switch {
			case ph == "string" || ph == "value":
				t.Errorf("%v: --%s shows the placeholder %q, which names nothing", args, name, ph)
			case ph[0] >= '0' && ph[0] <= '9', ph == def:
				t.Errorf("%v: --%s shows %q, which reads as a value", args, name, ph)
			}
		}
	}
	if seen < 50 {
		t.Fatalf("read only %d flags with placeholders: the help format changed?", seen)
	}
}
