package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/calltap/calltap/web/help"
)

func runHelpCmd(args ...string) (code int, out, errOut string) {
	var o, e bytes.Buffer
	code = run(context.Background(), append([]string{"help"}, args...), Stdio{In: strings.NewReader(""), Out: &o, Err: &e})
	return code, o.String(), e.String()
}

// calltap help lists the commands and then every topic with its line;
// each topic prints as plain text; a name that is neither exits 2 with one
// line naming the topics.
func TestHelpTopics(t *testing.T) {
	code, out, _ := runHelpCmd()
	topics := help.Topics()
	if code != 0 || !strings.Contains(out, "Commands:") || !strings.Contains(out, "Topics (calltap help TOPIC):") {
		t.Fatalf("calltap help: %d\n%s", code, out)
	}
	if len(topics) < 9 {
		t.Fatalf("%d topics, want at least data, stopping, team, chaos, limits, internals, performance and more", len(topics))
	}
	for _, want := range []string{"data", "stopping", "team", "chaos", "limits", "internals", "performance", "routes"} {
		if _, ok := help.Markdown(want); !ok {
			t.Errorf("no topic %q", want)
		}
	}
	if strings.Index(out, "Commands:") > strings.Index(out, "Topics") {
		t.Error("the topics come before the commands")
	}
	for _, tp := range topics {
		if !strings.Contains(out, tp.Name) || tp.Summary == "" || !strings.Contains(out, tp.Summary) {
			t.Errorf("calltap help does not list %s with its line %q", tp.Name, tp.Summary)
		}
		code, text, errOut := runHelpCmd(tp.Name)
		if code != 0 || errOut != "" || len(text) < 200 {
			t.Errorf("calltap help %s: %d, %d bytes, %q", tp.Name, code, len(text), errOut)
		}
		if strings.Contains(text, "**") || strings.Contains(text, "```") || strings.Contains(text, "<!--") {
			t.Errorf("calltap help %s prints Markdown, not plain text:\n%s", tp.Name, text)
		}
	}
	code, out, errOut := runHelpCmd("nope")
	if code != 2 || out != "" || strings.Count(errOut, "\n") != 1 {
		t.Fatalf("calltap help nope: %d, %q, %q; want exit 2 and one line", code, out, errOut)
	}
	for _, tp := range topics {
		if !strings.Contains(errOut, tp.Name) {
			t.Errorf("calltap help nope does not name topic %s: %q", tp.Name, errOut)
		}
	}
	if code, out, _ := runHelpCmd("replay"); code != 0 || !strings.Contains(out, "calltap replay") {
		t.Errorf("calltap help replay: %d %q, want the command's flags", code, out)
	}
}
