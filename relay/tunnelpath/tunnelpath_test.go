package tunnelpath_test

import (
	"bufio"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/calltap/calltap/relay/tunnelpath"
)

func refused(t testing.TB) []string {
	t.Helper()
	b, err := os.ReadFile("testdata/refused.txt")
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		if line := sc.Text(); line != "" && !strings.HasPrefix(line, "#") {
			paths = append(paths, line)
		}
	}
	return paths
}

func TestCheckRefusesEverySpelling(t *testing.T) {
	paths := refused(t)
	if len(paths) != 189 {
		t.Fatalf("%d paths in testdata/refused.txt, want 189", len(paths))
	}
	more := []string{
		"/.", "/..", "/...", "/. .", "/.. ", "/%2e%2e%3b/b", "/%u002e%u002e/admin", "/%U002E./x",
		"/%zz/%2e", "/%25zz/%25%32%65", "/a%2F..%2Fb", "/a/..%5Cb", "/a\\.\\b", "/%2e%2e%252f%2e%2e", "/%e2%80%ae/x", // right-to-left override
	}
	for _, p := range append(paths, more...) {
		if err := tunnelpath.Check(p); err == nil {
			t.Errorf("Check(%q) = nil, want refused", p)
		}
	}
}

func TestCheckPassesOrdinaryPaths(t *testing.T) {
	for _, p := range []string{
		"", "/", "/calls/events", "/a..b/.c/c./x.json", "/.well-known/acme", "/%2e%2ex", "/100%", "/%",
		"/caf%C3%A9/%E6%97%A5%E6%9C%AC", "/café/日本/ü", "/a%20b", "/v1/cb;jsessionid=1", "/%25", "/a%2Fb",
		"/\u2025x", // a two-dot leader inside a name is a name
	} {
		if err := tunnelpath.Check(p); err != nil {
			t.Errorf("Check(%q) = %v, want nil", p, err)
		}
	}
}

func TestCheckSaysWhy(t *testing.T) {
	for p, want := range map[string]error{
		"/%c0%ae%c0%ae/admin":                  tunnelpath.ErrNotUTF8,
		"/..%00/admin":                         tunnelpath.ErrControl,
		"/%ef%bc%8e%ef%bc%8e/admin":            tunnelpath.ErrDotSegment,
		"/%" + strings.Repeat("25", 20) + "2e": tunnelpath.ErrTooDeep,
	} {
		if err := tunnelpath.Check(p); !errors.Is(err, want) {
			t.Errorf("Check(%q) = %v, want %v", p, err, want)
		}
	}
}
