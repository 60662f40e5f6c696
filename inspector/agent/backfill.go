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
	"github.com/calltap/calltap/relay/api"
	"github.com/calltap/calltap/relay/wire"
	"github.com/calltap/calltap/storage/agentdb"
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
	Header wire.Header
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
	if o.Forward && a.forwardTo == nil && a.routes.Load() == nil {
		return BackfillResult{Items: []BackfillItem{}}, errors.New("backfill: forwarding needs a local handler (--forward-to or --routes)")
	}
	if o.PublicURL == "" {
		o.PublicURL = a.TunnelState().PublicURL
	}
	b := &backfill{a: a, c: c, o: o, res: BackfillResult{Items: []BackfillItem{}}}
	err := b.run(ctx)
	return b.res, err
}

// backfill is one run of Backfill, owned by the goroutine that called it.
type backfill struct {
	a   *Agent
	c   *service.Client
	o   BackfillOptions
	res BackfillResult   // what was done so far
	p   BackfillProgress // what the last report said, less the phase
}

// run lists the log, sorts out what never came, then fetches and imports
// it oldest first.
func (b *backfill) run(ctx context.Context) error {
	list, err := b.list(ctx)
	if err != nil {
		return err
	}
	missing, err := b.sortOut(ctx, list)
	if err != nil {
		return err
	}
	b.report("fetching")
	if err := b.fetchAndImport(ctx, missing); err != nil {
		return err
	}
	if err := b.a.Flush(ctx); err != nil {
		return err
	}
	b.report("done")
	return nil
}

// report tells o.Progress, if set, how far the run has got.
func (b *backfill) report(phase string) {
	b.p.Phase = phase
	b.p.Imported, b.p.Forwarded = b.res.Imported, b.res.Forwarded
	if b.o.Progress != nil {
		b.o.Progress(b.p)
	}
}

// list reads the deliveries in the window from the service's log, newest
// first, reporting each page.
func (b *backfill) list(ctx context.Context) ([]service.Delivery, error) {
	f := service.Filter{CallID: b.o.CallID}
	if b.o.Since > 0 {
		f.Since = time.Now().Add(-b.o.Since)
	}
	list, err := b.c.Deliveries(ctx, f, func(sp service.Progress) {
		b.p.Pages, b.p.Count, b.p.Listed = sp.Pages, sp.Count, sp.Seen
		b.report("listing")
	})
	b.res.Pages, b.res.Listed = b.p.Pages, len(list)
	return list, err
}

// sortOut counts the listed deliveries the store already holds and those
// the service has not sent yet, and returns the rest, oldest first so that
// a call's events reach the handler in order.
func (b *backfill) sortOut(ctx context.Context, list []service.Delivery) ([]service.Delivery, error) {
	ids := make([]string, len(list))
	for i, d := range list {
		ids[i] = d.ID
	}
	known, err := b.a.store.KnownDeliveryIDs(ctx, ids)
	if err != nil {
		return nil, err
	}
	var missing []service.Delivery
	for i := len(list) - 1; i >= 0; i-- { // the log is newest first
		d := list[i]
		switch {
		case known[d.ID]:
			b.res.Known++
		case d.Status == "pending" && d.Attempts == 0:
			// Not sent yet (or being sent right now): it will still come
			// through the tunnel, and importing it would make it twice.
			b.res.NotSent++
		default:
			missing = append(missing, d)
		}
	}
	sort.SliceStable(missing, func(i, j int) bool { return missing[i].CreatedAt.Before(missing[j].CreatedAt.Time) })
	b.res.Missing, b.p.Missing = len(missing), len(missing)
	return missing, nil
}

// fetchedDelivery is the answer to one GET /webhooks/{id}/.
type fetchedDelivery struct {
	d   *service.Delivery
	err error
}

// fetchAndImport reads the missing deliveries' records a few ahead while
// importing them in order.
func (b *backfill) fetchAndImport(ctx context.Context, missing []service.Delivery) error {
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	results, sem := prefetch(fctx, b.c, missing)
	for i, d := range missing {
		var r fetchedDelivery
		select {
		case r = <-results[i]:
		case <-ctx.Done():
			return ctx.Err()
		}
		<-sem
		if err := b.importFetched(ctx, d, r); err != nil {
			return err
		}
	}
	return nil
}

// prefetch reads the record of each of missing, in order, at most
// fetchAhead ahead of the reader: results[i] gets the i-th, and the reader
// takes a slot from sem for each result it takes. It stops when ctx ends.
func prefetch(ctx context.Context, c *service.Client, missing []service.Delivery) (results []chan fetchedDelivery, sem chan struct{}) {
	results = make([]chan fetchedDelivery, len(missing))
	for i := range results {
		results[i] = make(chan fetchedDelivery, 1)
	}
	sem = make(chan struct{}, fetchAhead) // a slot per fetch not yet imported
	go func() {
		for i, d := range missing {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			go func() {
				rec, err := c.Delivery(ctx, d.ID)
				results[i] <- fetchedDelivery{rec, err}
			}()
		}
	}()
	return results, sem
}

// importFetched records one missing delivery as an item and imports its
// fetched record, then reports. A delivery gone from the log since it was
// listed is a failed item (not reported: nothing was fetched); any other
// fetch error ends the run.
func (b *backfill) importFetched(ctx context.Context, d service.Delivery, r fetchedDelivery) error {
	item := BackfillItem{DeliveryID: d.ID, Event: d.Event, CallID: d.CallID}
	if !d.CreatedAt.IsZero() {
		item.CreatedAt = *api.Time(d.CreatedAt.Time)
	}
	if r.err != nil {
		if !errors.Is(r.err, service.ErrNotFound) {
			return r.err
		}
		item.Error = r.err.Error()
		b.res.Failed++
		b.res.Items = append(b.res.Items, item)
		return nil
	}
	b.res.Fetched++
	b.p.Fetched = b.res.Fetched
	if err := b.a.importDelivery(ctx, r.d, b.o, &item, &b.res); err != nil {
		return err
	}
	b.res.Items = append(b.res.Items, item)
	b.report("fetching")
	return nil
}

// importDelivery saves one fetched delivery as a capture and forwards it
// when asked to.
func (a *Agent) importDelivery(ctx context.Context, d *service.Delivery, o BackfillOptions, item *BackfillItem, res *BackfillResult) error {
	if len(d.Payload) == 0 {
		item.Error = "the service's record holds no payload"
		res.Failed++
		return nil
	}
	h := wire.Header{{Name: "Content-Type", Value: "application/json"}}
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
	if err := a.cm.save(ctx, writeOp{insert: c}); err != nil {
		return fmt.Errorf("saving delivery %s: %w", d.ID, err)
	}
	res.Imported++
	item.CaptureID = c.ID
	if !o.Forward || c.Status == agentdb.StatusStored {
		return nil
	}
	a.deliver(ctx, c, 1)
	res.Forwarded++
	if c.ResponseStatus > 0 {
		st := c.ResponseStatus
		item.ResponseStatus = &st
	}
	if c.Status == agentdb.StatusDelivered {
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
