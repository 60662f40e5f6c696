package agent

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/calltap/calltap/inspector/voice/service"
	"github.com/calltap/calltap/relay"
	"github.com/calltap/calltap/relay/api"
	"github.com/calltap/calltap/storage"
)

// BackfillOptions says which deliveries a backfill looks at and what it
// does with those that never reached the agent.
type BackfillOptions struct {
	// Since keeps deliveries the service created within this window; 0
	// means the whole log. The log has no date filter, so the window is
	// applied to created_at here.
	Since  time.Duration
	CallID string // only this call's deliveries
	// Forward sends each imported delivery on to the local handler
	// (Config.ForwardTo), one at a time, oldest first.
	Forward bool
	// Header is added to each imported request after Content-Type: the
	// delivery log does not keep the event_webhook_headers a delivery was
	// sent with, and a handler that checks them needs them back.
	Header relay.Header
	// PublicURL is the tunnel's public URL: a delivery to a URL under it
	// is captured with the rest of the path, as the tunnel would have.
	// Empty: the connected tunnel's, else a leading /t/<tunnel-id> is
	// dropped.
	PublicURL string
	// Progress, when set, is told how far the backfill has got.
	Progress func(BackfillProgress)
}

// BackfillProgress is reported after each page of the log and each
// delivery fetched.
type BackfillProgress struct {
	Phase     string // "listing", "fetching" or "done"
	Pages     int    // pages of the log read
	Count     int    // the log's count (of the call's deliveries with CallID)
	Listed    int    // deliveries read from the log
	Missing   int    // in the window and not in the local store
	Fetched   int    // read with GET /webhooks/{id}/
	Imported  int    // saved as captures
	Forwarded int    // sent on to the local handler
}

// BackfillResult is what a backfill did.
type BackfillResult struct {
	Pages     int            `json:"pages"`     // pages of the delivery log read
	Listed    int            `json:"listed"`    // deliveries in the window
	Known     int            `json:"known"`     // already in the local store
	NotSent   int            `json:"not_sent"`  // not attempted by the service yet: they are still to come
	Missing   int            `json:"missing"`   // never reached the agent
	Fetched   int            `json:"fetched"`   // read from the service
	Imported  int            `json:"imported"`  // saved as captures with source "backfill"
	Forwarded int            `json:"forwarded"` // sent on to the handler (whatever it answered)
	Failed    int            `json:"failed"`    // missing but not imported (see the items' errors)
	Delivered int            `json:"delivered"` // forwarded and answered 2xx
	Items     []BackfillItem `json:"items"`     // the missing deliveries, oldest first
}

// BackfillItem is one delivery that had not reached the agent.
type BackfillItem struct {
	DeliveryID     string `json:"delivery_id"`
	Event          string `json:"event"`
	CallID         string `json:"call_id"`
	CreatedAt      string `json:"created_at"`           // at the service
	CaptureID      string `json:"capture_id,omitempty"` // the capture it became
	ResponseStatus *int   `json:"response_status"`      // the handler's answer, when forwarded
	Error          string `json:"error,omitempty"`      // why it was not imported, or the forward's error
}

// fetchAhead is how many deliveries are read from the service while the
// earlier ones are imported.
const fetchAhead = 4

// Backfill finds the deliveries in the service's log that never reached
// the agent (sent while it was offline and no relay queue held them),
// reads each exact payload with GET /webhooks/{id}/ and saves it as a
// capture with source "backfill", indexed like any other; with Forward it
// sends each on to the local handler. What the store already holds (by
// the payload's id, the delivery id) is skipped, so a second run imports
// nothing. On an error it returns what was done so far with the error.
func (a *Agent) Backfill(ctx context.Context, c *service.Client, o BackfillOptions) (BackfillResult, error) {
	res := BackfillResult{Items: []BackfillItem{}}
	if o.Forward && a.forwardTo == nil {
		return res, errors.New("backfill: forwarding needs a local handler (--forward-to)")
	}
	if o.PublicURL == "" {
		o.PublicURL = a.TunnelState().PublicURL
	}
	var p BackfillProgress
	report := func(phase string) {
		p.Phase = phase
		p.Imported, p.Forwarded = res.Imported, res.Forwarded
		if o.Progress != nil {
			o.Progress(p)
		}
	}

	f := service.Filter{CallID: o.CallID}
	if o.Since > 0 {
		f.Since = time.Now().Add(-o.Since)
	}
	list, err := c.Deliveries(ctx, f, func(sp service.Progress) {
		p.Pages, p.Count, p.Listed = sp.Pages, sp.Count, sp.Seen
		report("listing")
	})
	res.Pages, res.Listed = p.Pages, len(list)
	if err != nil {
		return res, err
	}

	ids := make([]string, len(list))
	for i, d := range list {
		ids[i] = d.ID
	}
	known, err := a.store.KnownDeliveryIDs(ctx, ids)
	if err != nil {
		return res, err
	}
	var missing []service.Delivery
	for i := len(list) - 1; i >= 0; i-- { // the log is newest first
		d := list[i]
		switch {
		case known[d.ID]:
			res.Known++
		case d.Status == "pending" && d.Attempts == 0:
			// Not sent yet (or being sent right now): it will still come
			// through the tunnel, and importing it would make it twice.
			res.NotSent++
		default:
			missing = append(missing, d)
		}
	}
	// Oldest first, so that a call's events reach the handler in order.
	sort.SliceStable(missing, func(i, j int) bool { return missing[i].CreatedAt.Before(missing[j].CreatedAt.Time) })
	res.Missing, p.Missing = len(missing), len(missing)
	report("fetching")

	// Read a few ahead while importing in order.
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type fetched struct {
		d   *service.Delivery
		err error
	}
	results := make([]chan fetched, len(missing))
	for i := range results {
		results[i] = make(chan fetched, 1)
	}
	sem := make(chan struct{}, fetchAhead) // a slot per fetch not yet imported
	go func() {
		for i, d := range missing {
			select {
			case sem <- struct{}{}:
			case <-fctx.Done():
				return
			}
			go func() {
				rec, err := c.Delivery(fctx, d.ID)
				results[i] <- fetched{rec, err}
			}()
		}
	}()
	for i, d := range missing {
		var r fetched
		select {
		case r = <-results[i]:
		case <-ctx.Done():
			return res, ctx.Err()
		}
		<-sem
		item := BackfillItem{DeliveryID: d.ID, Event: d.Event, CallID: d.CallID}
		if !d.CreatedAt.IsZero() {
			item.CreatedAt = *api.Time(d.CreatedAt.Time)
		}
		if r.err != nil {
			if errors.Is(r.err, service.ErrNotFound) {
				// Gone from the log since it was listed.
				item.Error = r.err.Error()
				res.Failed++
				res.Items = append(res.Items, item)
				continue
			}
			return res, r.err
		}
		res.Fetched++
		p.Fetched = res.Fetched
		if err := a.importDelivery(ctx, r.d, o, &item, &res); err != nil {
			return res, err
		}
		res.Items = append(res.Items, item)
		report("fetching")
	}
	if err := a.Flush(ctx); err != nil {
		return res, err
	}
	report("done")
	return res, nil
}

// importDelivery saves one fetched delivery as a capture and forwards it
// when asked to.
func (a *Agent) importDelivery(ctx context.Context, d *service.Delivery, o BackfillOptions, item *BackfillItem, res *BackfillResult) error {
	if len(d.Payload) == 0 {
		item.Error = "the service's record holds no payload"
		res.Failed++
		return nil
	}
	h := relay.Header{{Name: "Content-Type", Value: "application/json"}}
	h = append(h, o.Header...)
	c := a.newCapture(SourceBackfill, "POST", deliveryURI(d.URL, o.PublicURL), h, []byte(d.Payload))
	if c.DeliveryID == "" {
		// Not a call event the index recognises: keep the delivery's id
		// anyway, so that the next run knows it has it.
		c.DeliveryID = d.ID
	}
	if item.Event == "" {
		item.Event, item.CallID = c.Event, c.CallID
	}
	// The tunnel may have brought it meanwhile (a retry that came through
	// while we listed), or its payload names another id we hold.
	known, err := a.store.KnownDeliveryIDs(ctx, []string{c.DeliveryID})
	if err != nil {
		return err
	}
	if known[c.DeliveryID] {
		res.Known++
		res.Missing--
		item.Error = "already in the local store"
		return nil
	}
	if err := a.save(ctx, writeOp{insert: c}); err != nil {
		return fmt.Errorf("saving delivery %s: %w", d.ID, err)
	}
	res.Imported++
	item.CaptureID = c.ID
	if !o.Forward {
		return nil
	}
	a.deliver(ctx, c, 1)
	res.Forwarded++
	if c.ResponseStatus > 0 {
		st := c.ResponseStatus
		item.ResponseStatus = &st
	}
	if c.Status == storage.StatusDelivered {
		res.Delivered++
	} else {
		item.Error = c.Error
		if item.Error == "" {
			item.Error = fmt.Sprintf("the handler answered %d", c.ResponseStatus)
		}
	}
	return nil
}

// deliveryURI is the path and query a delivery to deliveryURL would have
// been captured with: what follows the tunnel's public URL.
func deliveryURI(deliveryURL, publicURL string) string {
	u, err := url.Parse(deliveryURL)
	if err != nil {
		return "/"
	}
	p := u.EscapedPath()
	trimmed := false
	if publicURL != "" {
		if pu, err := url.Parse(publicURL); err == nil && strings.EqualFold(pu.Host, u.Host) {
			prefix := strings.TrimSuffix(pu.EscapedPath(), "/")
			if p == prefix || strings.HasPrefix(p, prefix+"/") {
				p, trimmed = strings.TrimPrefix(p, prefix), true
			}
		}
	}
	if !trimmed {
		// The relay's tunnel paths are /t/<tunnel-id>/<rest>.
		if rest, ok := strings.CutPrefix(p, "/t/"); ok {
			_, after, _ := strings.Cut(rest, "/")
			p = "/" + after
		}
	}
	if p == "" {
		p = "/"
	}
	if u.RawQuery != "" {
		p += "?" + u.RawQuery
	}
	return p
}
