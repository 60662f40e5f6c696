package emulator

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/calltap/calltap/inspector/voice/callevent"
	"github.com/calltap/calltap/storage/servicedb"
)

// SeedWebhookURL is where seeded past calls say they delivered. The .invalid
// name never resolves, so a replay of a seeded delivery cannot reach anyone.
const SeedWebhookURL = "https://hooks.example.invalid/voice/events"

var (
	firstNames = []string{"Jordan", "Avery", "Riley", "Morgan", "Casey", "Quinn", "Harper", "Rowan", "Emerson", "Sage", "Dakota", "Reese", "Parker", "Skyler", "Logan"}
	lastNames  = []string{"Lee", "Patel", "Garcia", "Nguyen", "Smith", "Okafor", "Rossi", "Kim", "Silva", "Cohen", "Murphy", "Haddad", "Novak", "Tanaka", "Brown"}
	cities     = []string{"Austin", "Denver", "Chicago", "Seattle", "Boston", "Atlanta", "Portland", "Miami"}
	plans      = []string{"trial", "starter", "pro"}
	sources    = []string{"webinar", "referral", "ads", "website"}
)

// randomName picks a full name; rng nil means the global source.
func randomName(rng *rand.Rand) string {
	pick := rand.IntN
	if rng != nil {
		pick = rng.IntN
	}
	return firstNames[pick(len(firstNames))] + " " + lastNames[pick(len(lastNames))]
}

func emailOf(name string) string {
	return strings.ToLower(strings.ReplaceAll(name, " ", ".")) + "@example.com"
}

// seed fills an empty database with n contacts and n past calls, one every
// ten minutes up to ten minutes ago, each with its deliveries: most
// delivered at the first attempt, some after a 503 and a retry, some
// refused with a 404 (not retried). A database with contacts is left alone,
// so restarting with --seed adds nothing.
func (s *Server) seed(ctx context.Context, n int) error {
	if have, err := s.db.CountContacts(ctx); err != nil || have > 0 {
		return err
	}
	rng := rand.New(rand.NewPCG(uint64(n), 0x5eed))
	now := s.now().Truncate(time.Second)
	start := now.Add(-time.Duration(n+1) * 10 * time.Minute)
	base := s.cfg.PublicURL
	if base == "" {
		base = "http://127.0.0.1"
	}
	contacts := seedContacts(rng, n, start)
	calls := make([]*servicedb.Call, n)
	deliveries := make([][]*servicedb.Delivery, n)
	attempts := map[string][]*servicedb.Attempt{}
	for i, c := range contacts {
		var err error
		if calls[i], deliveries[i], err = s.seedCall(i, c, base, attempts); err != nil {
			return err
		}
	}
	return s.db.SeedService(ctx, contacts, calls, deliveries, attempts)
}

// seedContacts makes n contacts, one every ten minutes from start.
func seedContacts(rng *rand.Rand, n int, start time.Time) []*servicedb.Contact {
	contacts := make([]*servicedb.Contact, n)
	for i := range contacts {
		name := randomName(rng)
		cf, _ := json.Marshal(map[string]any{
			"city": cities[rng.IntN(len(cities))], "plan": plans[rng.IntN(len(plans))], "lead_source": sources[rng.IntN(len(sources))],
		})
		contacts[i] = &servicedb.Contact{
			ID: uuid.NewString(), Name: name, Phone: fmt.Sprintf("+1415%07d", 5550000+i), Email: emailOf(name),
			CustomFields: string(cf), CreatedAt: start.Add(time.Duration(i) * 10 * time.Minute),
		}
	}
	return contacts
}

// seedCall makes the i-th past call, to contact c, with its deliveries;
// their attempts go into attempts by delivery id.
func (s *Server) seedCall(i int, c *servicedb.Contact, base string, attempts map[string][]*servicedb.Attempt) (*servicedb.Call, []*servicedb.Delivery, error) {
	scenario, flow, outcome := ScenarioCompleted, callevent.FlowCompleted, ""
	switch {
	case i%6 == 5:
		scenario, flow, outcome = ScenarioBusy, callevent.FlowFailed, "busy"
	case i%11 == 10:
		scenario, flow, outcome = ScenarioNoAnswer, callevent.FlowFailed, "no_answer"
	}
	var cf map[string]any
	json.Unmarshal([]byte(c.CustomFields), &cf)
	spec := callevent.CallSpec{
		CallID: uuid.NewString(), To: c.Phone, Flow: flow, OutcomeCode: outcome,
		Contact:   callevent.Contact{ID: c.ID, Name: c.Name, Phone: c.Phone, Email: c.Email, CustomFields: cf},
		Variables: map[string]any{"lead_id": fmt.Sprintf("L-%04d", 1000+i)},
		ExpiresIn: int(s.cfg.MediaExpiresIn / time.Second),
	}
	dispatched := c.CreatedAt.Add(5 * time.Minute)
	events, err := s.generate(spec, dispatched, 1, base)
	if err != nil {
		return nil, nil, err
	}
	call := &servicedb.Call{
		ID: spec.CallID, Scenario: scenario, FromNumber: events[0].payload.Call.FromNumber, ToNumber: c.Phone,
		ContactID: c.ID, ContactName: c.Name, AgentName: events[0].payload.Call.Agent.Name,
		WebhookURL: SeedWebhookURL, DispatchedAt: dispatched,
	}
	var deliveries []*servicedb.Delivery
	for _, e := range events {
		if e.payload.Event == callevent.KindRecordingAvailable {
			call.RecordingAt = e.at
		}
		d, err := newDelivery(call.ID, e, SeedWebhookURL, nil)
		if err != nil {
			return nil, nil, err
		}
		d.NextAt = time.Time{}
		attempts[d.ID] = seedAttempts(i, e, d)
		deliveries = append(deliveries, d)
	}
	return call, deliveries, nil
}

// seedAttempts makes the attempts of the i-th call's delivery d of event e
// and sets d's outcome from them: most delivered at the first attempt,
// some after a 503 and a retry, some refused with a 404 (not retried).
func seedAttempts(i int, e timedEvent, d *servicedb.Delivery) []*servicedb.Attempt {
	ok := func(at time.Time, try int) *servicedb.Attempt {
		return &servicedb.Attempt{Try: try, At: at, ResponseStatus: 200, ResponseBody: []byte(`{"ok":true}`), Duration: 42 * time.Millisecond}
	}
	var as []*servicedb.Attempt
	switch {
	case i%9 == 4 && e.payload.Event == callevent.KindAnalysisCompleted:
		retry := e.at.Add(callevent.RetrySchedule()[1])
		as = []*servicedb.Attempt{
			{Try: 1, At: e.at, ResponseStatus: 503, ResponseBody: []byte("upstream unavailable"), Error: "HTTP 503", Duration: 120 * time.Millisecond},
			ok(retry, 2),
		}
		d.Status, d.Attempts, d.DeliveredAt = StatusDelivered, 2, retry.Add(42*time.Millisecond)
	case i%13 == 7 && (e.payload.Event == callevent.KindEnded || e.payload.Event == callevent.KindFailed):
		as = []*servicedb.Attempt{{Try: 1, At: e.at, ResponseStatus: 404, ResponseBody: []byte("not found"), Error: "HTTP 404: not retried", Duration: 8 * time.Millisecond}}
		d.Status, d.Attempts = StatusFailed, 1
	default:
		as = []*servicedb.Attempt{ok(e.at, 1)}
		d.Status, d.Attempts, d.DeliveredAt = StatusDelivered, 1, e.at.Add(42*time.Millisecond)
	}
	last := as[len(as)-1]
	d.ResponseStatus, d.ResponseBody, d.Error = last.ResponseStatus, last.ResponseBody, last.Error
	return as
}
