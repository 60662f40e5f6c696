package web_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/google/uuid"

	"github.com/calltap/calltap/relay/polltest"
)

// tickBoxes reads the call timeline's visible axis labels: their text and
// bounding boxes, left to right.
const tickBoxes = `JSON.stringify([...document.querySelectorAll('[data-view=calls] .tl-axis .tl-tick')]
	.filter(e => e.checkVisibility({visibilityProperty: true}))
	.map(e => { const r = e.getBoundingClientRect(); return {text: e.textContent, left: r.left, right: r.right}; })
	.sort((a, b) => a.left - b.left))`

// The call timeline's axis labels never overlap, whatever the call's span
// (a second to a day) and the window's width; at least two stay to give
// the scale.
func TestBrowserTimelineAxisReadsAtAnySpan(t *testing.T) {
	browser := startBrowser(t)
	s := startStack(t)
	tb := newTab(t, browser, s.InspectorURL)
	for _, span := range []time.Duration{time.Second, 7 * time.Second, 45 * time.Second, 3 * time.Minute,
		17 * time.Minute, 95 * time.Minute, 13 * time.Hour, 24 * time.Hour} {
		callID := uuid.NewString()
		now := time.Now()
		// occurred span ago and just now; received now: the span is the
		// call's, give or take the few ms of the delivery.
		for _, e := range []struct {
			kind string
			at   time.Time
		}{{"call.started", now.Add(-span)}, {"call.ended", now}} {
			if code := s.send(t, "/hook", event(e.kind, callID, e.at, nil)); code != 200 {
				t.Fatalf("sender got %d", code)
			}
		}
		tb.do(chromedp.EmulateViewport(1400, 900))
		tb.open("/calls/" + callID)
		tb.waitFor("the call's timeline", `document.querySelectorAll('[data-view=calls] .tl-lane:not(.tl-head)').length === 2 && document.querySelectorAll('[data-view=calls] .tl-tick').length > 1`)
		for _, width := range []int64{1400, 1100, 900, 760, 640} {
			tb.do(chromedp.EmulateViewport(width, 900))
			// Let the resize reach the page: two frames.
			tb.js(`window.framesSeen = false; requestAnimationFrame(() => requestAnimationFrame(() => { window.framesSeen = true; }))`)
			tb.waitFor("two frames", `window.framesSeen`)
			var ticks []struct {
				Text        string
				Left, Right float64
			}
			if err := json.Unmarshal([]byte(tb.str(tickBoxes)), &ticks); err != nil {
				t.Fatal(err)
			}
			what := fmt.Sprintf("span %s at %d px", span, width)
			if width == 900 && (span == time.Second || span == 24*time.Hour) {
				tb.shot(fmt.Sprintf("span-%s", span))
			}
			if len(ticks) < 2 {
				t.Errorf("%s: %d axis labels visible, want 2 or more", what, len(ticks))
			}
			for i := 1; i < len(ticks); i++ {
				if a, b := ticks[i-1], ticks[i]; a.Right > b.Left {
					t.Errorf("%s: labels %q and %q overlap (%.1f > %.1f)", what, a.Text, b.Text, a.Right, b.Left)
					tb.shot("overlap")
				}
			}
		}
	}
}

// flagsOfRow is the list's marks on the row of capture id, space-separated.
func flagsOfRow(id string) string {
	return `[...(` + rowFor(id) + `?.querySelectorAll('.c-flags .flag') || [])].map(f => f.textContent.trim().toLowerCase()).join(' ')`
}

// The requests list marks what calltap requests marks: a replay of a
// delivery shows both "replay" and "dup" (its payload id is stored
// already), and a capture marked to keep shows "kept", at once when
// Keep is clicked in its detail.
func TestBrowserListMarksReplaysAndKept(t *testing.T) {
	browser := startBrowser(t)
	s := startStack(t)
	tb := newTab(t, browser, s.InspectorURL)
	orig := s.sendStarted(t)
	if code := apiStatus(t, s, "POST", "/api/v1/ext/webhooks/replay/", fmt.Sprintf(`{"id":%q}`, orig)); code != 200 {
		t.Fatalf("replay: %d", code)
	}
	var replay summary
	polltest.Until(t, wait, func() bool {
		for _, c := range s.captures(t) {
			if c.ReplayOf == orig {
				replay = c
			}
		}
		return replay.ID != ""
	}, "the replay was not listed")
	if replay.DuplicateOf == "" {
		t.Fatalf("the replay is not a duplicate in the API: %+v", replay)
	}

	tb.open("/")
	tb.waitFor("both rows", rowFor(orig)+` && `+rowFor(replay.ID))
	if got := tb.str(flagsOfRow(replay.ID)); got != "replay dup" {
		t.Errorf("the replay's row shows %q, want both marks, as calltap requests shows 'duplicate replay'", got)
	}
	tb.open("/requests/" + orig)
	tb.waitFor("the detail", `!!document.querySelector('.detail-pane .act-keep')`)
	tb.waitFor("the row", rowFor(orig))
	tb.click(".detail-pane .act-keep")
	tb.waitFor("the kept mark in the list", flagsOfRow(orig)+` === 'kept'`)
	tb.shot("kept-and-replay")
	tb.open("/")
	tb.waitFor("the kept mark after a reload", flagsOfRow(orig)+` === 'kept'`)
}
