package web_test

import (
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/calltap/calltap/web/help"
)

// The inspector's Help shows every topic of `calltap help`, reached from
// the UI's own link, rendered from the same texts and escaped: a topic's
// "<tunnel-id>" is text on the page, never an element, and no script runs.
func TestHelpInBrowser(t *testing.T) {
	s := startStack(t)
	tb := newTab(t, startBrowser(t), s.InspectorURL)
	tb.open("/")
	tb.click("#help-link")
	tb.waitFor("the topics' list", `document.querySelectorAll('main.help ul.help-topics li').length > 0`)
	topics := help.Topics()
	for _, tp := range topics {
		if text := tb.str(`document.querySelector('main.help').innerText`); !strings.Contains(text, tp.Name) || !strings.Contains(text, tp.Summary) {
			t.Errorf("Help's list lacks %s: %q", tp.Name, text)
		}
	}
	for _, tp := range topics {
		tb.do(chromedp.Navigate(s.InspectorURL + "/help/" + tp.Name))
		tb.waitFor(tp.Name, `document.title === "calltap help `+tp.Name+`"`)
		body := tb.str(`document.querySelector('main.help').innerText`)
		if !strings.Contains(body, tp.Summary) || len(body) < 200 {
			t.Errorf("Help %s shows %d characters without its summary %q", tp.Name, len(body), tp.Summary)
		}
		if strings.Contains(body, "**") || strings.Contains(body, "```") {
			t.Errorf("Help %s shows Markdown marks:\n%s", tp.Name, body)
		}
		if n := tb.str(`String(document.querySelectorAll('main.help script, main.help tunnel-id, main.help call-id, main.help id').length)`); n != "0" {
			t.Errorf("Help %s made %s elements out of its text", tp.Name, n)
		}
	}
	// The regression topic's examples hold placeholders in angle brackets:
	// they read as text.
	tb.do(chromedp.Navigate(s.InspectorURL + "/help/regression"))
	tb.waitFor("the regression topic", `document.title === "calltap help regression"`)
	if body := tb.str(`document.querySelector('main.help').innerText`); !strings.Contains(body, "<tunnel-id>") {
		t.Errorf("the placeholder <tunnel-id> is not shown as text:\n%s", body)
	}
	tb.do(chromedp.Navigate(s.InspectorURL + "/help/<script>alert(1)</script>"))
	tb.waitFor("the page for no topic", `document.title === "calltap help"`)
	if body := tb.str(`document.querySelector('main.help').innerText`); !strings.Contains(body, "No topic") {
		t.Errorf("a name that is no topic: %q", body)
	}
	if n := tb.dialogs.Load(); n != 0 {
		t.Errorf("%d dialogs opened: a topic's text ran code", n)
	}
}
