package inspector

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/calltap/calltap/relay/api"
	"github.com/calltap/calltap/storage"
	"github.com/calltap/calltap/storage/agentdb"
)

// How a capture reference was read (CaptureRef.By).
const (
	RefID       = "id"       // a whole capture id
	RefDelivery = "delivery" // a delivery id: the payload's id, which trigger and the service print
	RefPrefix   = "prefix"   // the start of one capture id
)

// CaptureRef is what a user's reference to a capture named: every
// command and route that takes a capture id reads it with ResolveCapture,
// so the id trigger prints, the one the list shows and a short prefix of
// either capture id all work alike.
type CaptureRef struct {
	Ref      string
	By       string
	Captures []*agentdb.Capture // oldest first; one unless By is RefDelivery
}

// IDs are the captures' ids, oldest first.
func (r CaptureRef) IDs() []string {
	ids := make([]string, len(r.Captures))
	for i, c := range r.Captures {
		ids[i] = c.ID
	}
	return ids
}

// Original is the capture a delivery id stands for when one is wanted
// (replay): the first one received that is neither a duplicate nor a
// replay, else the oldest.
func (r CaptureRef) Original() *agentdb.Capture {
	for _, c := range r.Captures {
		if c.DuplicateOf == "" && c.ReplayOf == "" {
			return c
		}
	}
	return r.Captures[0]
}

// maxChoices bounds the captures an ambiguous reference lists.
const maxChoices = 10

// maxDeliveryCopies bounds how many captures one delivery id resolves to:
// the service's retries, duplicates and replays of one event.
const maxDeliveryCopies = api.MaxLimit

// ResolveCapture reads ref as, in this order, a capture id, a delivery id
// (every capture of it), or the start of exactly one capture id. A prefix
// that starts several ids is a 409 listing them; nothing matched is a 404
// that names the three things tried.
func ResolveCapture(ctx context.Context, db *agentdb.AgentStore, ref string) (CaptureRef, error) {
	ref = strings.TrimSpace(ref)
	if ref == "" {
		return CaptureRef{}, api.Invalid("want a capture id, a prefix of one, or a delivery id")
	}
	out := CaptureRef{Ref: ref}
	c, err := db.Capture(ctx, ref)
	if err == nil {
		c.Body, c.ResponseBody = nil, nil // the summary's fields are what a caller wants
		out.By, out.Captures = RefID, []*agentdb.Capture{c}
		return out, nil
	} else if !errors.Is(err, storage.ErrNotFound) {
		return out, err
	}
	byDelivery, _, err := db.Captures(ctx, agentdb.CaptureFilter{DeliveryID: ref, Page: storage.Page{Limit: maxDeliveryCopies}})
	if err != nil {
		return out, err
	}
	if len(byDelivery) > 0 {
		slices.Reverse(byDelivery) // listed newest first
		out.By, out.Captures = RefDelivery, byDelivery
		return out, nil
	}
	byPrefix, n, err := db.Captures(ctx, agentdb.CaptureFilter{IDPrefix: strings.ToLower(ref), Page: storage.Page{Limit: maxChoices}})
	if err != nil {
		return out, err
	}
	switch {
	case n == 0:
		return out, api.NotFound(fmt.Sprintf("capture %s (tried as a capture id, a delivery id and the start of a capture id)", ref))
	case n > 1:
		return out, ambiguous(ref, n, byPrefix)
	}
	out.By, out.Captures = RefPrefix, byPrefix
	return out, nil
}

// ambiguous is the 409 of a prefix that starts n ids: its message lists
// those in shown, one a line, so a person can pick.
func ambiguous(ref string, n int, shown []*agentdb.Capture) *api.Error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s starts %d capture ids; give more of one:", ref, n)
	for _, c := range shown {
		fmt.Fprintf(&b, "\n  %s", Describe(c))
	}
	if n > len(shown) {
		fmt.Fprintf(&b, "\n  … and %d more", n-len(shown))
	}
	return api.Errorf(http.StatusConflict, CodeAmbiguous, "%s", b.String())
}

// CodeAmbiguous is the error code of a capture reference that names more
// than one capture (409).
const CodeAmbiguous = "ambiguous_id"

// Describe is one line that tells a capture from its siblings: id, time,
// event and what it is a copy of.
func Describe(c *agentdb.Capture) string {
	s := c.ID + "  " + c.CreatedAt.Local().Format("2006-01-02 15:04:05.000")
	if c.Event != "" {
		s += "  " + c.Event
	}
	switch {
	case c.ReplayOf != "":
		s += "  replay of " + c.ReplayOf
	case c.DuplicateOf != "":
		s += "  duplicate of " + c.DuplicateOf
	}
	return s
}
