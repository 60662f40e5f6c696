package agent

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/calltap/calltap/inspector/voice/callevent"
	"github.com/calltap/calltap/inspector/voice/service"
)

// importOne has a imports d as a backfill does, forwarding when forward is
// set, and returns the item and the run's counts.
func importOne(t *testing.T, ctx context.Context, a *Agent, d *service.Delivery, item BackfillItem, forward bool) (BackfillItem, BackfillResult) {
	t.Helper()
	res := BackfillResult{Missing: 1}
	o := BackfillOptions{Forward: forward, PublicURL: "http://pub.example/t/abc"}
	if err := a.importDelivery(ctx, d, o, &item, &res); err != nil {
		t.Fatal(err)
	}
	return item, res
}

// A delivery whose payload is not a call event the index knows is kept
// under the service's delivery id, so that the next run finds it already
// held instead of importing it again.
func TestBackfillKeepsAnUnknownPayloadsDeliveryID(t *testing.T) {
	a := runAgent(t, &seen{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d := &service.Delivery{DeliverySummary: callevent.DeliverySummary{ID: "wh_plain", URL: "http://pub.example/t/abc/hooks"}, Payload: []byte(`{"hello":"world"}`)}

	item, res := importOne(t, ctx, a, d, BackfillItem{DeliveryID: d.ID}, false)
	if res.Imported != 1 || item.CaptureID == "" || item.Error != "" {
		t.Fatalf("first import: %+v, item %+v", res, item)
	}
	cp, err := a.store.Capture(ctx, item.CaptureID)
	if err != nil {
		t.Fatal(err)
	}
	if cp.DeliveryID != d.ID {
		t.Errorf("captured with delivery id %q, want the service's %q", cp.DeliveryID, d.ID)
	}
	again, res := importOne(t, ctx, a, d, BackfillItem{DeliveryID: d.ID}, false)
	if res.Imported != 0 || res.Known != 1 || res.Missing != 0 || again.Error != "already in the local store" {
		t.Errorf("second import: %+v, item %+v", res, again)
	}
}

// An item takes its event and call from the payload when the listing gave
// none, and keeps the listing's when it gave them.
func TestBackfillItemEventFromThePayload(t *testing.T) {
	a := runAgent(t, &seen{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	payload := []byte(`{"id":"wh_1","event":"call.ended","call":{"call_id":"call_9"}}`)

	item, _ := importOne(t, ctx, a, &service.Delivery{DeliverySummary: callevent.DeliverySummary{ID: "wh_1"}, Payload: payload}, BackfillItem{DeliveryID: "wh_1"}, false)
	if item.Event != "call.ended" || item.CallID != "call_9" {
		t.Errorf("unlisted event: item has event %q, call %q; want the payload's call.ended, call_9", item.Event, item.CallID)
	}
	payload = []byte(`{"id":"wh_2","event":"call.ended","call":{"call_id":"call_9"}}`)
	listed := BackfillItem{DeliveryID: "wh_2", Event: "call.answered", CallID: "call_8"}
	item, _ = importOne(t, ctx, a, &service.Delivery{DeliverySummary: callevent.DeliverySummary{ID: "wh_2"}, Payload: payload}, listed, false)
	if item.Event != "call.answered" || item.CallID != "call_8" {
		t.Errorf("listed event: item has event %q, call %q; want the listing's call.answered, call_8", item.Event, item.CallID)
	}
}

// A delivery forwarded to a handler that answers an error says which
// status it answered, when sending itself went well.
func TestBackfillItemSaysTheHandlersStatus(t *testing.T) {
	a := runAgent(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusInternalServerError) }))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	payload := []byte(`{"id":"wh_3","event":"call.ended","call":{"call_id":"call_9"}}`)

	item, res := importOne(t, ctx, a, &service.Delivery{DeliverySummary: callevent.DeliverySummary{ID: "wh_3"}, Payload: payload}, BackfillItem{DeliveryID: "wh_3"}, true)
	if res.Forwarded != 1 || res.Delivered != 0 || item.ResponseStatus == nil || *item.ResponseStatus != http.StatusInternalServerError {
		t.Fatalf("forwarded to a failing handler: %+v, item %+v", res, item)
	}
	if want := "the handler answered 500"; item.Error != want {
		t.Errorf("item error %q, want %q", item.Error, want)
	}
}
