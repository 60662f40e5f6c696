package servicedb

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// t0 is a moment on a whole microsecond, as the columns keep it.
var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func open(t *testing.T) *Store {
	t.Helper()
	db, err := Open(context.Background(), filepath.Join(t.TempDir(), "service.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// The first value stored under a key is the one kept.
func TestInitServiceSetting(t *testing.T) {
	ctx, db := context.Background(), open(t)
	for _, try := range []string{"first", "second"} {
		got, err := db.InitServiceSetting(ctx, "secret", try)
		if err != nil {
			t.Fatal(err)
		}
		if got != "first" {
			t.Errorf("after storing %q: kept %q, want %q", try, got, "first")
		}
	}
}

// wantErr reports err unless it is target.
func wantErr(t *testing.T, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Errorf("%s: err = %v, want %v", what, err, target)
	}
}

// A contact saved again keeps what the new copy leaves empty and merges
// its custom fields.
func TestContactUpsert(t *testing.T) {
	ctx, db := context.Background(), open(t)
	c := &Contact{ID: "c1", Name: "Ada", Phone: "+100", Email: "ada@example.com", CreatedAt: t0}
	if err := db.SeedService(ctx, []*Contact{c}, nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	if c.Seq == 0 || c.CustomFields != "{}" || !c.CreatedAt.Equal(t0) {
		t.Errorf("saved contact %+v: want a seq, custom fields {} and its creation time", c)
	}
	again := &Contact{ID: "c1", Email: "ada@new.example", CustomFields: `{"tier":"gold"}`, CreatedAt: t0.Add(time.Hour)}
	third := &Contact{ID: "c1", CustomFields: `{"city":"Oslo"}`}
	if err := db.SeedService(ctx, []*Contact{again, third}, nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	want := Contact{Seq: c.Seq, ID: "c1", Name: "Ada", Phone: "+100", Email: "ada@new.example", CustomFields: `{"tier":"gold","city":"Oslo"}`, CreatedAt: t0}
	if *third != want {
		t.Errorf("after two upserts the caller holds %+v, want %+v", *third, want)
	}
	got, err := db.ContactByID(ctx, "c1")
	if err != nil || *got != want {
		t.Errorf("ContactByID = %+v, %v; want %+v", got, err, want)
	}
}

// Lookups by id and by phone (the oldest contact with it) find a contact,
// and miss with ErrNotFound; a custom field is in use when a contact has
// it.
func TestContactLookups(t *testing.T) {
	ctx, db := context.Background(), open(t)
	cs := []*Contact{
		{ID: "c1", Phone: "+100", CustomFields: `{"tier":"gold"}`, CreatedAt: t0},
		{ID: "c2", Phone: "+100", CustomFields: `{"city":"Oslo"}`, CreatedAt: t0},
	}
	if err := db.SeedService(ctx, cs, nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	if got, err := db.ContactByPhone(ctx, "+100"); err != nil || got.ID != "c1" {
		t.Errorf("ContactByPhone = %+v, %v; want c1", got, err)
	}
	_, err := db.ContactByID(ctx, "nobody")
	wantErr(t, "ContactByID(unknown)", err, ErrNotFound)
	_, err = db.ContactByPhone(ctx, "+999")
	wantErr(t, "ContactByPhone(unknown)", err, ErrNotFound)
	for name, want := range map[string]bool{"tier": true, "city": true, "plan": false} {
		if got, err := db.CustomFieldInUse(ctx, name); err != nil || got != want {
			t.Errorf("CustomFieldInUse(%q) = %v, %v; want %v", name, got, err, want)
		}
	}
	if n, err := db.CountContacts(ctx); err != nil || n != 2 {
		t.Errorf("CountContacts = %d, %v; want 2", n, err)
	}
}

// A contact whose custom fields are not JSON is refused, and the
// transaction it was in keeps nothing.
func TestContactBadCustomFields(t *testing.T) {
	ctx, db := context.Background(), open(t)
	good := &Contact{ID: "c1", CreatedAt: t0}
	bad := &Contact{ID: "c2", CustomFields: "{not json", CreatedAt: t0}
	if err := db.SeedService(ctx, []*Contact{good, bad}, nil, nil, nil); err == nil || !strings.Contains(err.Error(), "save contact") {
		t.Errorf("SeedService with bad JSON: err = %v, want a save contact error", err)
	}
	if n, err := db.CountContacts(ctx); err != nil || n != 0 {
		t.Errorf("after the failed seed: %d contacts, %v; want 0", n, err)
	}
}

func ids[T any](rows []T, id func(T) string) string {
	var s []string
	for _, r := range rows {
		s = append(s, id(r))
	}
	return strings.Join(s, ",")
}

func contactID(c *Contact) string { return c.ID }

// ListContacts filters by column or custom field, case-insensitively,
// ANDs filters, skips empty ones, counts ignoring the page and lists
// newest first.
func TestListContacts(t *testing.T) {
	ctx, db := context.Background(), open(t)
	var cs []*Contact
	for i, city := range []string{"Oslo", "Lima", "oslo", "Rome", "Oslo"} {
		cs = append(cs, &Contact{
			ID: fmt.Sprintf("c%d", i), Name: fmt.Sprintf("N%d", i%2), Phone: fmt.Sprintf("+%d", i), CreatedAt: t0,
			CustomFields: fmt.Sprintf(`{"city":%q,"n":%d}`, city, i),
		})
	}
	if err := db.SeedService(ctx, cs, nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		filters []ContactFilter
		page    Page
		want    string
		count   int
	}{
		{"all", nil, Page{Limit: 10}, "c4,c3,c2,c1,c0", 5},
		{"paged", nil, Page{Limit: 2, Offset: 1}, "c3,c2", 5},
		{"empty filter ignored", []ContactFilter{{Field: "name"}}, Page{Limit: 10}, "c4,c3,c2,c1,c0", 5},
		{"filter after an empty one", []ContactFilter{{Field: "email"}, {Field: "name", Values: []string{"N1"}}}, Page{Limit: 10}, "c3,c1", 2},
		{"column", []ContactFilter{{Field: "name", Values: []string{"n1"}}}, Page{Limit: 10}, "c3,c1", 2},
		{"column, two values", []ContactFilter{{Field: "phone", Values: []string{"+0", "+3"}}}, Page{Limit: 10}, "c3,c0", 2},
		{"custom", []ContactFilter{{Field: "city", Custom: true, Values: []string{"OSLO"}}}, Page{Limit: 10}, "c4,c2,c0", 3},
		{"custom number", []ContactFilter{{Field: `n"`, Custom: true, Values: []string{"3"}}}, Page{Limit: 10}, "c3", 1},
		{"and", []ContactFilter{{Field: "city", Custom: true, Values: []string{"oslo"}}, {Field: "name", Values: []string{"N0"}}}, Page{Limit: 10}, "c4,c2,c0", 3},
		{"and, narrower", []ContactFilter{{Field: "city", Custom: true, Values: []string{"oslo", "lima"}}, {Field: "name", Values: []string{"N1"}}}, Page{Limit: 1}, "c1", 1},
	} {
		got, n, err := db.ListContacts(ctx, tc.filters, tc.page)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if ids(got, contactID) != tc.want || n != tc.count {
			t.Errorf("%s: got %s (count %d), want %s (count %d)", tc.name, ids(got, contactID), n, tc.want, tc.count)
		}
	}
	_, _, err := db.ListContacts(ctx, []ContactFilter{{Field: "custom_fields) OR (1", Values: []string{"x"}}}, Page{Limit: 10})
	if err == nil || !strings.Contains(err.Error(), "is not a contact field") {
		t.Errorf("filter on an unknown column: err = %v", err)
	}
}

// describeDelivery is what a test compares of a delivery: its state,
// times as offsets from t0.
func describeDelivery(d *Delivery) string {
	at := func(x time.Time) string {
		if x.IsZero() {
			return "-"
		}
		return x.Sub(t0).String()
	}
	return fmt.Sprintf("%s %s %d/%d round %d next %s response %d %q delivered %s", d.ID, d.Status, d.Attempts, d.MaxAttempts, d.Round,
		at(d.NextAt), d.ResponseStatus, d.ResponseBody, at(d.DeliveredAt))
}

// describeAttempts is what a test compares of an attempt log.
func describeAttempts(as []*Attempt) string {
	var s []string
	for _, a := range as {
		s = append(s, fmt.Sprintf("%d: round %d try %d at %v response %d %q error %q took %v",
			a.N, a.Round, a.Try, a.At.Sub(t0), a.ResponseStatus, a.ResponseBody, a.Error, a.Duration))
	}
	return strings.Join(s, "; ")
}

// A call is saved with its contact, its deliveries and their attempts;
// reading it back gives what was saved.
func TestCreateCall(t *testing.T) {
	ctx, db := context.Background(), open(t)
	call := &Call{
		ID: "call1", Scenario: "completed", FromNumber: "+1", ToNumber: "+2", ContactID: "c1", ContactName: "Ada",
		AgentName: "Bob", WebhookURL: "http://hook", DispatchedAt: t0, RecordingAt: t0.Add(time.Minute),
	}
	ds := []*Delivery{delivery("d1", "call1", t0), delivery("d2", "call1", t0.Add(time.Second))}
	attempts := map[string][]*Attempt{"d1": {
		{Round: 0, Try: 1, At: t0, ResponseStatus: 500, ResponseBody: []byte("no"), Duration: 1500 * time.Microsecond},
		{Round: 0, Try: 2, At: t0.Add(time.Second), Error: "refused", Duration: time.Millisecond},
	}}
	if err := db.CreateCall(ctx, call, &Contact{ID: "c1", Name: "Ada", CreatedAt: t0}, ds, attempts); err != nil {
		t.Fatal(err)
	}
	if ds[0].Seq == 0 || ds[1].Seq != ds[0].Seq+1 {
		t.Errorf("delivery seqs %d, %d: want consecutive places", ds[0].Seq, ds[1].Seq)
	}
	if got, err := db.CallByID(ctx, "call1"); err != nil || *got != *call {
		t.Errorf("CallByID = %+v, %v; want %+v", got, err, call)
	}
	if _, err := db.ContactByID(ctx, "c1"); err != nil {
		t.Errorf("the call's contact was not saved: %v", err)
	}
	d, as, err := db.DeliveryByID(ctx, "d1", t0)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := describeDelivery(d), `d1 pending 0/5 round 0 next 0s response 0 "" delivered -`; got != want || d.Seq != ds[0].Seq ||
		string(d.Payload) != `{"id":"d1"}` || d.Headers != "[]" {
		t.Errorf("delivery d1 read back as %s (%+v), want %s", got, d, want)
	}
	want := `1: round 0 try 1 at 0s response 500 "no" error "" took 1.5ms; 2: round 0 try 2 at 1s response 0 "" error "refused" took 1ms`
	if got := describeAttempts(as); got != want || describeAttempts(attempts["d1"]) != want {
		t.Errorf("attempts read back as %s, numbered %s; want %s", got, describeAttempts(attempts["d1"]), want)
	}
}

// A call without a recording reads back with none; a call id saved twice
// fails whole, and its new delivery is not kept.
func TestCreateCallAgain(t *testing.T) {
	ctx, db := context.Background(), open(t)
	failed := &Call{ID: "call2", Scenario: "failed:busy", FromNumber: "+1", ToNumber: "+3", DispatchedAt: t0}
	if err := db.CreateCall(ctx, failed, nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	if got, err := db.CallByID(ctx, "call2"); err != nil || !got.RecordingAt.IsZero() || *got != *failed {
		t.Errorf("CallByID(call2) = %+v, %v; want %+v", got, err, failed)
	}
	_, err := db.CallByID(ctx, "call3")
	wantErr(t, "CallByID(unknown)", err, ErrNotFound)
	if err := db.CreateCall(ctx, failed, nil, []*Delivery{delivery("d9", "call2", t0)}, nil); err == nil {
		t.Error("a second call with the same id was saved")
	}
	_, _, err = db.DeliveryByID(ctx, "d9", t0)
	wantErr(t, "the refused call's delivery", err, ErrNotFound)
}

// SeedService saves calls with their own deliveries; a failure anywhere
// keeps nothing.
func TestSeedService(t *testing.T) {
	ctx, db := context.Background(), open(t)
	calls := []*Call{{ID: "a", Scenario: "completed", DispatchedAt: t0}, {ID: "b", Scenario: "completed", DispatchedAt: t0}}
	ds := [][]*Delivery{{delivery("a1", "a", t0)}, {delivery("b1", "b", t0), delivery("b2", "b", t0)}}
	att := map[string][]*Attempt{"b2": {{Try: 1, At: t0}}}
	if err := db.SeedService(ctx, []*Contact{{ID: "c", CreatedAt: t0}}, calls, ds, att); err != nil {
		t.Fatal(err)
	}
	got, n, err := db.ListDeliveries(ctx, DeliveryFilter{CallID: "b"}, t0, Page{Limit: 10})
	if err != nil || n != 2 || ids(got, deliveryID) != "b2,b1" {
		t.Errorf("call b's deliveries: %s (count %d), %v; want b2,b1", ids(got, deliveryID), n, err)
	}
	if _, as, err := db.DeliveryByID(ctx, "b2", t0); err != nil || len(as) != 1 || as[0].N != 1 {
		t.Errorf("b2's attempts: %v, %v; want one, numbered 1", as, err)
	}
	dup := [][]*Delivery{{delivery("c1", "c", t0)}, {delivery("a1", "d", t0)}}
	err = db.SeedService(ctx, nil, []*Call{{ID: "c", DispatchedAt: t0}, {ID: "d", DispatchedAt: t0}}, dup, nil)
	if err == nil || !strings.Contains(err.Error(), "save delivery") {
		t.Errorf("seeding a delivery id twice: err = %v, want a save delivery error", err)
	}
	if _, err := db.CallByID(ctx, "c"); !errors.Is(err, ErrNotFound) {
		t.Errorf("call c of the failed seed: err = %v, want ErrNotFound", err)
	}
	// An attempt made after the seed is numbered after the seeded ones.
	seeded := map[string][]*Attempt{"e1": {{Try: 1, At: t0}}}
	err = db.SeedService(ctx, nil, []*Call{{ID: "e", DispatchedAt: t0}, {ID: "f", DispatchedAt: t0}},
		[][]*Delivery{{delivery("e1", "e", t0)}, {delivery("f1", "f", t0)}}, seeded)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.FinishAttempt(ctx, "e1", 0, &Attempt{Try: 2, At: t0}, AttemptOutcome{Status: "pending"}); err != nil {
		t.Fatal(err)
	}
	if _, as, _ := db.DeliveryByID(ctx, "e1", t0); len(as) != 2 || as[1].N != 2 {
		t.Errorf("e1's attempts after FinishAttempt: %v; want numbers 1, 2", as)
	}
}

func delivery(id, call string, created time.Time) *Delivery {
	return &Delivery{
		ID: id, CallID: call, Event: "call.completed", URL: "http://hook", Headers: "[]", Payload: []byte(`{"id":"` + id + `"}`),
		Status: "pending", MaxAttempts: 5, NextAt: created, CreatedAt: created,
	}
}

func deliveryID(d *Delivery) string { return d.ID }

// ListDeliveries shows rows due by now only, filters by call, event and
// status, and lists by creation time newest first, then by place.
func TestListDeliveries(t *testing.T) {
	ctx, db := context.Background(), open(t)
	d1 := delivery("d1", "x", t0)
	d2 := delivery("d2", "x", t0.Add(time.Second))
	d2.Event = "call.recording"
	d3 := delivery("d3", "y", t0)
	d3.Status = "delivered"
	d4 := delivery("d4", "y", t0.Add(time.Hour)) // not yet
	calls := []*Call{{ID: "x", DispatchedAt: t0}, {ID: "y", DispatchedAt: t0}}
	if err := db.SeedService(ctx, nil, calls, [][]*Delivery{{d1, d2}, {d3, d4}}, nil); err != nil {
		t.Fatal(err)
	}
	now := t0.Add(time.Second)
	for _, tc := range []struct {
		f     DeliveryFilter
		now   time.Time
		page  Page
		want  string
		count int
	}{
		{DeliveryFilter{}, now, Page{Limit: 10}, "d2,d3,d1", 3},
		{DeliveryFilter{}, t0, Page{Limit: 10}, "d3,d1", 2},
		{DeliveryFilter{}, t0.Add(time.Hour), Page{Limit: 10}, "d4,d2,d3,d1", 4},
		{DeliveryFilter{}, now, Page{Limit: 1, Offset: 1}, "d3", 3},
		{DeliveryFilter{CallID: "x"}, now, Page{Limit: 10}, "d2,d1", 2},
		{DeliveryFilter{Event: "call.recording"}, now, Page{Limit: 10}, "d2", 1},
		{DeliveryFilter{Status: "delivered"}, now, Page{Limit: 10}, "d3", 1},
		{DeliveryFilter{CallID: "y", Status: "pending"}, now, Page{Limit: 10}, "", 0},
		{DeliveryFilter{CallID: "x", Event: "call.completed", Status: "pending"}, now, Page{Limit: 10}, "d1", 1},
	} {
		got, n, err := db.ListDeliveries(ctx, tc.f, tc.now, tc.page)
		if err != nil {
			t.Errorf("%+v: %v", tc.f, err)
			continue
		}
		if ids(got, deliveryID) != tc.want || n != tc.count {
			t.Errorf("%+v at %v: got %s (count %d), want %s (count %d)", tc.f, tc.now.Sub(t0), ids(got, deliveryID), n, tc.want, tc.count)
		}
	}
	if _, _, err := db.DeliveryByID(ctx, "d4", now); !errors.Is(err, ErrNotFound) {
		t.Errorf("a delivery not yet due: err = %v, want ErrNotFound", err)
	}
	if d, _, err := db.DeliveryByID(ctx, "d4", t0.Add(time.Hour)); err != nil || d.ID != "d4" {
		t.Errorf("a delivery due just now: %v, %v", d, err)
	}
}

// seedDue saves one call per name in calls, each with deliveries due at
// the given offsets from t0 (created at t0).
func seedDue(t *testing.T, db *Store, calls map[string][]time.Duration) {
	t.Helper()
	var cs []*Call
	var ds [][]*Delivery
	for call, dues := range calls {
		cs = append(cs, &Call{ID: call, DispatchedAt: t0})
		var row []*Delivery
		for i, due := range dues {
			d := delivery(fmt.Sprintf("%s%d", call, i+1), call, t0)
			d.NextAt = t0.Add(due)
			row = append(row, d)
		}
		ds = append(ds, row)
	}
	if err := db.SeedService(context.Background(), nil, cs, ds, nil); err != nil {
		t.Fatal(err)
	}
}

// claim claims up to limit deliveries due by at and returns their ids.
func claim(t *testing.T, db *Store, at time.Time, limit int) string {
	t.Helper()
	got, err := db.ClaimDueDeliveries(context.Background(), at, limit)
	if err != nil {
		t.Fatal(err)
	}
	return ids(got, deliveryID)
}

// nextDue is NextDeliveryDue as an offset from t0, or "none".
func nextDue(t *testing.T, db *Store) string {
	t.Helper()
	at, ok, err := db.NextDeliveryDue(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		return "none"
	}
	return at.Sub(t0).String()
}

// A claim takes at most limit deliveries due by now, one per call and none
// of a call in flight, earliest due first; NextDeliveryDue is the earliest
// that could be claimed.
func TestClaimDueDeliveries(t *testing.T) {
	db := open(t)
	if got := nextDue(t, db); got != "none" {
		t.Errorf("NextDeliveryDue on an empty log = %s, want none", got)
	}
	seedDue(t, db, map[string][]time.Duration{
		"a": {0, 1 * time.Second, 2 * time.Second},
		"b": {3 * time.Second},
		"c": {4 * time.Second},
		"d": {time.Hour},
	})
	for _, step := range []struct {
		at      time.Duration
		limit   int
		claimed string
		next    string // NextDeliveryDue after the claim
	}{
		{4 * time.Second, 2, "a1,b1", "4s"}, // a and b in flight: c is next
		{time.Hour, 5, "c1,d1", "none"},     // every call in flight
	} {
		if got := claim(t, db, t0.Add(step.at), step.limit); got != step.claimed {
			t.Fatalf("claim of %d at %v: %s, want %s", step.limit, step.at, got, step.claimed)
		}
		if got := nextDue(t, db); got != step.next {
			t.Errorf("after claiming %s: next due %s, want %s", step.claimed, got, step.next)
		}
	}
	if err := db.ReleaseDelivery(context.Background(), "a1"); err != nil {
		t.Fatal(err)
	}
	if got := claim(t, db, t0.Add(time.Hour), 5); got != "a1" {
		t.Fatalf("claim after releasing a1: %s, want a1 again", got)
	}
}

// A limit of one takes one call's delivery even when that call has more
// due: the query reads more rows than the limit, to skip a call's later
// ones.
func TestClaimLimitOne(t *testing.T) {
	ctx, db := context.Background(), open(t)
	seedDue(t, db, map[string][]time.Duration{"a": {0, time.Second}, "b": {2 * time.Second}})
	got, err := db.ClaimDueDeliveries(ctx, t0.Add(time.Minute), 1)
	if err != nil || ids(got, deliveryID) != "a1" {
		t.Fatalf("claim of one: %s, %v; want a1", ids(got, deliveryID), err)
	}
	// Nothing is due a microsecond before the first due time.
	if err := db.ReleaseDelivery(ctx, "a1"); err != nil {
		t.Fatal(err)
	}
	if got, err := db.ClaimDueDeliveries(ctx, t0.Add(-time.Microsecond), 5); err != nil || len(got) != 0 {
		t.Errorf("claim before anything is due: %s, %v", ids(got, deliveryID), err)
	}
}

// At start-up nothing is in flight: a pending delivery keeps its due time
// (or is due at its creation when it had none), a finished one stays done.
func TestResetInflight(t *testing.T) {
	ctx, db := context.Background(), open(t)
	seedDue(t, db, map[string][]time.Duration{"a": {time.Second}, "b": {2 * time.Second}})
	if _, err := db.ClaimDueDeliveries(ctx, t0.Add(time.Minute), 5); err != nil {
		t.Fatal(err)
	}
	// b1 loses its due time and ends; a1 stays pending.
	if err := db.FinishAttempt(ctx, "b1", 0, &Attempt{Try: 1, At: t0}, AttemptOutcome{Status: "failed"}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Writer().ExecContext(ctx, `UPDATE deliveries SET inflight = 1 WHERE id = 'b1'`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Writer().ExecContext(ctx, `UPDATE deliveries SET next_at = NULL WHERE id = 'a1'`); err != nil {
		t.Fatal(err)
	}
	if err := db.ResetInflight(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := db.ClaimDueDeliveries(ctx, t0, 5)
	if err != nil || ids(got, deliveryID) != "a1" {
		t.Fatalf("claim after reset: %s, %v; want a1, due at its creation", ids(got, deliveryID), err)
	}
	var inflight int
	if err := db.Reader().QueryRowContext(ctx, `SELECT inflight FROM deliveries WHERE id = 'b1'`).Scan(&inflight); err != nil || inflight != 0 {
		t.Errorf("the finished delivery's inflight = %d, %v; want 0", inflight, err)
	}
}

// finish is FinishAttempt that fails the test on an error.
func finish(t *testing.T, db *Store, round int, a *Attempt, o AttemptOutcome) {
	t.Helper()
	if err := db.FinishAttempt(context.Background(), "a1", round, a, o); err != nil {
		t.Fatal(err)
	}
}

// a1 is delivery a1 as of t0+1h.
func a1(t *testing.T, db *Store) (string, string) {
	t.Helper()
	d, as, err := db.DeliveryByID(context.Background(), "a1", t0.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	return describeDelivery(d), describeAttempts(as)
}

// An attempt updates its round's delivery and is logged; an attempt of an
// older round is logged but leaves the replayed delivery as it is, and
// takes it out of flight.
func TestFinishAttemptAndReplay(t *testing.T) {
	ctx, db := context.Background(), open(t)
	seedDue(t, db, map[string][]time.Duration{"a": {0}})
	claim(t, db, t0, 1)
	finish(t, db, 0, &Attempt{Try: 1, At: t0, ResponseStatus: 503, ResponseBody: []byte("busy"), Duration: 2 * time.Millisecond},
		AttemptOutcome{Status: "pending", NextAt: t0.Add(time.Minute)})
	if d, _ := a1(t, db); d != `a1 pending 1/5 round 0 next 1m0s response 503 "busy" delivered -` {
		t.Errorf("after a failed attempt: %s", d)
	}
	// Claimed again, then replayed before the attempt ends.
	if got := claim(t, db, t0.Add(time.Minute), 1); got != "a1" {
		t.Fatalf("claim at the retry time: %s, want a1", got)
	}
	r, err := db.ReplayDelivery(ctx, "a1", t0.Add(61*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	replayed := `a1 pending 0/5 round 1 next 1m1s response 503 "busy" delivered -`
	if got := describeDelivery(r); got != replayed {
		t.Errorf("ReplayDelivery = %s, want %s", got, replayed)
	}
	late := &Attempt{Try: 2, At: t0.Add(time.Minute), ResponseStatus: 200, Duration: time.Millisecond}
	finish(t, db, 0, late, AttemptOutcome{Status: "delivered", DeliveredAt: t0.Add(62 * time.Second)})
	d, as := a1(t, db)
	if d != replayed {
		t.Errorf("the old round's attempt changed the replayed delivery: %s, want %s", d, replayed)
	}
	if want := `2: round 0 try 2 at 1m0s response 200 "" error "" took 1ms`; !strings.HasSuffix(as, "; "+want) {
		t.Errorf("attempt log %s: want the late attempt logged last as %s", as, want)
	}
	if got := claim(t, db, t0.Add(61*time.Second), 1); got != "a1" {
		t.Fatalf("claim in the new round: %s, want a1", got)
	}
	ok := &Attempt{Try: 1, At: t0.Add(61 * time.Second), ResponseStatus: 204}
	finish(t, db, 1, ok, AttemptOutcome{Status: "delivered", DeliveredAt: t0.Add(62 * time.Second)})
	if d, _ := a1(t, db); ok.N != 3 || d != `a1 delivered 1/5 round 1 next - response 204 "" delivered 1m2s` {
		t.Errorf("after the new round's success (N %d): %s", ok.N, d)
	}
	// A later attempt without a delivery time keeps the first one.
	finish(t, db, 1, &Attempt{Try: 2, At: t0.Add(63 * time.Second)}, AttemptOutcome{Status: "delivered"})
	if d, _ := a1(t, db); d != `a1 delivered 2/5 round 1 next - response 0 "" delivered 1m2s` {
		t.Errorf("after an attempt with no time nor response: %s", d)
	}
}

// A replay of a delivery that is not there, or not yet, is ErrNotFound.
func TestReplayUnknown(t *testing.T) {
	ctx, db := context.Background(), open(t)
	seedDue(t, db, map[string][]time.Duration{"a": {0}})
	_, err := db.ReplayDelivery(ctx, "nope", t0)
	wantErr(t, "ReplayDelivery(unknown)", err, ErrNotFound)
	_, err = db.ReplayDelivery(ctx, "a1", t0.Add(-time.Microsecond))
	wantErr(t, "ReplayDelivery before the delivery exists", err, ErrNotFound)
}
