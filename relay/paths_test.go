package relay_test

import (
	"bufio"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/calltap/calltap/cmd/stacktest"
)

// refusedPaths reads the spellings of dot segments the path rule refuses:
// 144 ASCII ones refused before, and 45 (overlong UTF-8, Unicode dot
// look-alikes, a dot pair then a NUL, space or tab) that got through.
func refusedPaths(t *testing.T, file string) []string {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var paths []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if line := sc.Text(); line != "" && !strings.HasPrefix(line, "#") {
			paths = append(paths, line)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(paths) != 144+45 {
		t.Fatalf("%s holds %d paths, want 189", file, len(paths))
	}
	return paths
}

func TestPathRuleAtTheRelay(t *testing.T) {
	rec, h := startHandler(t, nil)
	st := stacktest.Start(t, stacktest.Options{ForwardTo: h.URL + "/wh"})
	prefix := "/t/" + st.TunnelID
	for _, p := range refusedPaths(t, "tunnelpath/testdata/refused.txt") {
		status, body := rawPost(t, st.RelayAddr, prefix+p)
		if status != http.StatusBadRequest || errorCode(t, body) != "invalid_request" {
			t.Errorf("POST %s: %d %s, want 400 invalid_request", p, status, body)
		}
	}
	if got := rec.all(); len(got) != 0 {
		t.Errorf("the handler saw %d of them, the first at %s", len(got), got[0].Path)
	}
	// Ordinary paths, non-ASCII letters and anything in the query pass.
	for p, want := range map[string]string{
		"/calls/events":                 "/wh/calls/events",
		"/.well-known/a..b/.c/c.":       "/wh/.well-known/a..b/.c/c.",
		"/caf%C3%A9/%E6%97%A5%E6%9C%AC": "/wh/caf%C3%A9/%E6%97%A5%E6%9C%AC",
		"/a%20b/x.json":                 "/wh/a%20b/x.json",
		"/v1/cb;jsessionid=1":           "/wh/v1/cb;jsessionid=1",
		"/a/%2e%2ex?next=../x&nul=%00":  "/wh/a/%2e%2ex",
	} {
		n := len(rec.all())
		status, body := rawPost(t, st.RelayAddr, prefix+p)
		if status != http.StatusCreated {
			t.Errorf("POST %s: %d %s, want 201", p, status, body)
			continue
		}
		if got := rec.all(); len(got) != n+1 || got[n].Path != want {
			t.Errorf("POST %s reached the handler as %+v, want %s", p, got[n:], want)
		}
	}
}
