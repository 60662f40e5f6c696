package web_test

import (
	"bytes"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
)

// apiStatus sends method to the inspector's path and returns the status.
func apiStatus(t *testing.T, s *stack, method, path, body string) int {
	t.Helper()
	req, err := http.NewRequest(method, s.InspectorURL+path, bytes.NewReader([]byte(body)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return res.StatusCode
}

// From the inspector: a request is marked to keep, then deleted after a
// confirm (whose text shows the hostile path as text); a call is deleted
// with every request of it. What is deleted is gone from the list and the
// API, and its replay answers 404.
func TestBrowserDeleteAndKeep(t *testing.T) {
	browser := startBrowser(t)
	s := startStack(t)
	tb := newTab(t, browser, s.InspectorURL)

	callA, callB := uuid.NewString(), uuid.NewString()
	if code := s.send(t, "/hook/<b>bold</b>", event("call.started", callA, time.Now(), nil)); code != 200 {
		t.Fatalf("sender got %d", code)
	}
	for _, kind := range []string{"call.started", "call.ended"} {
		if code := s.send(t, "/hook", event(kind, callB, time.Now(), nil)); code != 200 {
			t.Fatalf("sender got %d", code)
		}
	}
	var id string
	for _, c := range s.captures(t) {
		if c.CallID == callA {
			id = c.ID
		}
	}
	if id == "" {
		t.Fatal("the capture of call A is not listed")
	}

	tb.open("/requests/" + id)
	tb.waitFor("the detail", `!!document.querySelector('.detail-pane .act-keep')`)
	tb.click(".detail-pane .act-keep")
	tb.waitFor("the keep mark", `document.querySelector('.detail-pane .act-keep')?.getAttribute('aria-pressed') === 'true'`)
	c, err := s.AgentDB.Capture(t.Context(), id)
	if err != nil || !c.Keep {
		t.Fatalf("after Keep: %+v, %v", c, err)
	}

	tb.click(".detail-pane .act-delete")
	tb.waitFor("the confirm", `!!document.querySelector('dialog.confirm-dlg[open]')`)
	if got := tb.str(`document.querySelector('dialog.confirm-dlg p').textContent`); !bytes.Contains([]byte(got), []byte("/hook/")) {
		t.Errorf("confirm text %q: want the request's path", got)
	}
	if tb.str(`String(document.querySelectorAll('dialog.confirm-dlg b').length)`) != "0" {
		t.Error("the path's markup became elements")
	}
	tb.shot("confirm")
	tb.click("dialog.confirm-dlg .act-confirm")
	tb.waitFor("the list without the request", `location.pathname === '/' && !`+rowFor(id)+` && document.querySelectorAll('[data-view=requests] .vrow[data-key]').length === 2`)
	if code := apiStatus(t, s, "GET", "/api/v1/ext/webhooks/"+id+"/", ""); code != 404 {
		t.Errorf("GET the deleted capture: %d, want 404", code)
	}
	if code := apiStatus(t, s, "POST", "/api/v1/ext/webhooks/replay/", fmt.Sprintf(`{"id":%q}`, id)); code != 404 {
		t.Errorf("replay of the deleted capture: %d, want 404", code)
	}

	tb.open("/calls/" + callB)
	tb.waitFor("the call", `!!document.querySelector('.act-delete-call')`)
	tb.click(".act-delete-call")
	tb.waitFor("the confirm", `!!document.querySelector('dialog.confirm-dlg[open]')`)
	tb.click("dialog.confirm-dlg .act-confirm")
	tb.waitFor("the calls list", `location.pathname === '/calls'`)
	if code := apiStatus(t, s, "GET", "/api/v1/ext/calls/"+callB+"/", ""); code != 404 {
		t.Errorf("GET the deleted call: %d, want 404", code)
	}
	if n := len(s.captures(t)); n != 0 {
		t.Errorf("%d captures left, want 0", n)
	}
}
