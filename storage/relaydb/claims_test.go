package relaydb

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/calltap/calltap/storage/relaystate"
)

// The seats of tunnel k7 in these tests: alice's and bob's claims, and the
// default seat, which is the tunnel id itself.
const (
	tunnel    = "k7"
	aliceSeat = tunnel + "-00000000000000a1"
	bobSeat   = tunnel + "-00000000000000b2"
)

func claimant(seat string, created time.Time, connected bool, claims ...string) *relaystate.Claimant {
	return &relaystate.Claimant{TunnelID: tunnel, Seat: seat, Claims: claims, CreatedAt: created, SeenAt: created, Connected: connected}
}

// describeClaimant is what a test compares of a claimant: all of it.
func describeClaimant(c *relaystate.Claimant) string {
	return fmt.Sprintf("%s of %s %q created %s seen %s connected %v",
		c.Seat, c.TunnelID, c.Claims, c.CreatedAt.Format(time.RFC3339Nano), c.SeenAt.Format(time.RFC3339Nano), c.Connected)
}

func claimantsOf(t *testing.T, db *Store) []string {
	t.Helper()
	cs, err := db.Claimants(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, c := range cs {
		out = append(out, describeClaimant(c))
	}
	return out
}

func saveClaimant(t *testing.T, db *Store, c *relaystate.Claimant) {
	t.Helper()
	if err := db.SaveClaimant(context.Background(), c); err != nil {
		t.Fatal(err)
	}
}

func rememberCall(t *testing.T, db *Store, callID, seat string, first, last time.Time) string {
	t.Helper()
	got, err := db.RememberCall(context.Background(), relaystate.CallRecord{TunnelID: tunnel, CallID: callID, Seat: seat, First: first, Last: last})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// A claimant's seat and the calls it was given are kept across a restart
// of the relay: an agent that is away when the relay restarts keeps its
// calls, and a call's later events still follow its first.
func TestClaimsSurviveReopen(t *testing.T) {
	ctx, db := context.Background(), open(t)
	alice := claimant(aliceSeat, t0.Add(123*time.Microsecond), false, "call.variables.developer=alice", "header:X-Dev=alice")
	saveClaimant(t, db, alice)
	rememberCall(t, db, "c1", aliceSeat, t0, t0)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	db = openAt(t, db.Path())
	if got, want := claimantsOf(t, db), []string{describeClaimant(alice)}; !slices.Equal(got, want) {
		t.Errorf("after a reopen, claimants\n%q\nwant\n%q", got, want)
	}
	if seat, err := db.CallSeat(ctx, tunnel, "c1"); seat != aliceSeat || err != nil {
		t.Errorf("after a reopen, CallSeat(c1) = %q, %v; want %s", seat, err, aliceSeat)
	}
}

// Saving a seat again updates when it was seen and whether it is
// connected, and keeps when it was first registered, which decides
// between two seats whose claims both match a call. Claimants come
// earliest registered first, then by seat.
func TestSaveClaimantKeepsCreatedAt(t *testing.T) {
	db := open(t)
	bob := claimant(bobSeat, t0, true, "call.variables.developer=bob")
	saveClaimant(t, db, bob)
	later := t0.Add(time.Hour)
	again := claimant(bobSeat, later, false, "call.variables.developer=bob")
	saveClaimant(t, db, again)
	bob.SeenAt, bob.Connected = later, false
	if got, want := claimantsOf(t, db), []string{describeClaimant(bob)}; !slices.Equal(got, want) {
		t.Errorf("after a second save, claimants\n%q\nwant\n%q", got, want)
	}

	alice := claimant(aliceSeat, t0, true, "call.variables.developer=alice")
	saveClaimant(t, db, alice)
	carol := claimant(tunnel+"-00000000000000c3", t0.Add(-time.Second), true)
	saveClaimant(t, db, carol)
	want := []string{describeClaimant(carol), describeClaimant(alice), describeClaimant(bob)}
	if got := claimantsOf(t, db); !slices.Equal(got, want) {
		t.Errorf("claimants\n%q\nwant, by registration then seat,\n%q", got, want)
	}
}

// Releasing a seat drops it and exactly its queue: the default seat's
// queue (the tunnel id's) and other seats' stay. An unknown seat, or one
// released already, is not found, and the message names it.
func TestReleaseClaimant(t *testing.T) {
	ctx, db := context.Background(), open(t)
	saveClaimant(t, db, claimant(aliceSeat, t0, false, "call.variables.developer=alice"))
	saveClaimant(t, db, claimant(bobSeat, t0, false, "call.variables.developer=bob"))
	for i, seat := range []string{aliceSeat, tunnel, aliceSeat, bobSeat, tunnel, aliceSeat} {
		r := &QueuedRequest{ID: fmt.Sprintf("r%d", i), TunnelID: seat, ArrivedAt: t0.UnixMicro(), Method: "POST", URI: "/hook", Headers: []byte{}, Body: []byte("{}")}
		if err := db.Enqueue(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := db.ReleaseClaimant(ctx, aliceSeat); n != 3 || err != nil {
		t.Errorf("ReleaseClaimant(alice) = %d, %v; want 3 dropped", n, err)
	}
	stats, err := db.QueueStatsByTunnel(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(stats[aliceSeat].Count, stats[tunnel].Count, stats[bobSeat].Count); got != "0 2 1" {
		t.Errorf("queued for alice, the default and bob: %s, want 0 2 1", got)
	}
	if got, want := claimantsOf(t, db), []string{describeClaimant(claimant(bobSeat, t0, false, "call.variables.developer=bob"))}; !slices.Equal(got, want) {
		t.Errorf("after alice's release, claimants\n%q\nwant\n%q", got, want)
	}

	for _, seat := range []string{aliceSeat, tunnel + "-00000000000000ff"} {
		n, err := db.ReleaseClaimant(ctx, seat)
		wantErr(t, "releasing "+seat, err, ErrNotFound)
		if n != 0 || err == nil || !strings.Contains(err.Error(), seat) {
			t.Errorf("ReleaseClaimant(%s) = %d, %v; want 0 and an error naming the seat", seat, n, err)
		}
	}
	if stats, _ := db.TunnelQueueStats(ctx, bobSeat); stats.Count != 1 {
		t.Errorf("bob's queue after the failed releases: %d, want 1", stats.Count)
	}
}

// A seat and its queue go together or not at all: a release whose queue
// cannot be dropped keeps the seat.
func TestReleaseClaimantAtomic(t *testing.T) {
	ctx, db := context.Background(), open(t)
	bob := claimant(bobSeat, t0, false, "call.variables.developer=bob")
	saveClaimant(t, db, bob)
	r := &QueuedRequest{ID: "r0", TunnelID: bobSeat, ArrivedAt: t0.UnixMicro(), Method: "POST", URI: "/hook", Headers: []byte{}, Body: []byte("{}")}
	if err := db.Enqueue(ctx, r); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Writer().ExecContext(ctx, `CREATE TRIGGER keep_queue BEFORE DELETE ON queue
		BEGIN SELECT RAISE(ABORT, 'the queue is kept'); END`); err != nil {
		t.Fatal(err)
	}
	if n, err := db.ReleaseClaimant(ctx, bobSeat); err == nil || !strings.Contains(err.Error(), "the queue is kept") {
		t.Errorf("ReleaseClaimant with its queue kept = %d, %v; want the database's error", n, err)
	}
	if got, want := claimantsOf(t, db), []string{describeClaimant(bob)}; !slices.Equal(got, want) {
		t.Errorf("after a failed release, claimants\n%q\nwant\n%q", got, want)
	}
}

// A call belongs to the seat its first event was remembered for: a later
// RememberCall with another seat gets that one back. Its last event only
// moves forward, which is what ExpireCalls goes by. The same call id on
// another tunnel is another call.
func TestRememberCallFirstSeatWins(t *testing.T) {
	ctx, db := context.Background(), open(t)
	if got := rememberCall(t, db, "c1", aliceSeat, t0, t0); got != aliceSeat {
		t.Errorf("a new call remembered for %s, want %s", got, aliceSeat)
	}
	t2 := t0.Add(2 * time.Minute)
	if got := rememberCall(t, db, "c1", bobSeat, t2, t2); got != aliceSeat {
		t.Errorf("c1's second event went to %s, want its first's seat %s", got, aliceSeat)
	}
	t1 := t0.Add(time.Minute)
	if got := rememberCall(t, db, "c1", tunnel, t1, t1); got != aliceSeat {
		t.Errorf("c1's late event went to %s, want %s", got, aliceSeat)
	}
	if seat, err := db.CallSeat(ctx, tunnel, "c1"); seat != aliceSeat || err != nil {
		t.Errorf("CallSeat(c1) = %q, %v; want %s", seat, err, aliceSeat)
	}
	// c1's last event is t2: the late one at t1 did not take it back.
	if n, err := db.ExpireCalls(ctx, t2); n != 0 || err != nil {
		t.Errorf("ExpireCalls(c1's last event) = %d, %v; want nothing expired", n, err)
	}
	if n, err := db.ExpireCalls(ctx, t2.Add(time.Microsecond)); n != 1 || err != nil {
		t.Errorf("ExpireCalls(after c1's last event) = %d, %v; want c1 expired", n, err)
	}

	other := relaystate.CallRecord{TunnelID: "m3", CallID: "c2", Seat: "m3", First: t0, Last: t0}
	rememberCall(t, db, "c2", bobSeat, t0, t0)
	if seat, err := db.RememberCall(ctx, other); seat != "m3" || err != nil {
		t.Errorf("c2 on another tunnel remembered for %q, %v; want m3", seat, err)
	}
	_, err := db.CallSeat(ctx, tunnel, "c3")
	wantErr(t, "CallSeat(unknown)", err, ErrNotFound)
	if err == nil || !strings.Contains(err.Error(), `"c3"`) {
		t.Errorf("CallSeat(unknown) = %v, want an error naming the call", err)
	}
}

// Calls are forgotten when their last event is older than the cutoff, and
// counted by seat from when they were first seen.
func TestExpireCallsAndCallsSince(t *testing.T) {
	ctx, db := context.Background(), open(t)
	at := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Minute) }
	for _, c := range []struct {
		id, seat    string
		first, last int // minutes after t0
	}{
		{"a1", aliceSeat, 0, 50}, {"a2", aliceSeat, 30, 40}, {"a3", aliceSeat, 45, 45},
		{"b1", bobSeat, 10, 20}, {"b2", bobSeat, 45, 60}, {"d1", tunnel, 40, 40},
	} {
		rememberCall(t, db, c.id, c.seat, at(c.first), at(c.last))
	}
	// A record without its first event's time began at its last event.
	rememberCall(t, db, "d2", tunnel, time.Time{}, at(35))
	since, err := db.CallsSince(ctx, at(30))
	want := map[string]int{aliceSeat: 2, bobSeat: 1, tunnel: 2}
	if err != nil || fmt.Sprint(since) != fmt.Sprint(want) {
		t.Errorf("CallsSince(30 min) = %v, %v; want %v", since, err, want)
	}
	if since, err := db.CallsSince(ctx, at(61)); err != nil || since == nil || len(since) != 0 {
		t.Errorf("CallsSince(after every call) = %#v, %v; want an empty map", since, err)
	}

	// Expiry drops what ended strictly before the cutoff: b1 (20), d2 (35),
	// d1 and a2 (40), not a3 (45).
	if n, err := db.ExpireCalls(ctx, at(41)); n != 4 || err != nil {
		t.Errorf("ExpireCalls(41 min) = %d, %v; want 4", n, err)
	}
	for id, known := range map[string]bool{"a1": true, "a2": false, "a3": true, "b1": false, "b2": true, "d1": false, "d2": false} {
		_, err := db.CallSeat(ctx, tunnel, id)
		if known != (err == nil) {
			t.Errorf("after expiry, CallSeat(%s) = %v; want known %v", id, err, known)
		}
	}
	since, err = db.CallsSince(ctx, at(0))
	want = map[string]int{aliceSeat: 2, bobSeat: 1}
	if err != nil || fmt.Sprint(since) != fmt.Sprint(want) {
		t.Errorf("after expiry, CallsSince(0) = %v, %v; want %v", since, err, want)
	}
}

// Eight remembering one call at once, each for its own seat, all get the
// same seat back, and it is the one kept.
func TestConcurrentRememberCall(t *testing.T) {
	ctx, db := context.Background(), open(t)
	const n = 8
	seats := make([]string, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			rec := relaystate.CallRecord{TunnelID: tunnel, CallID: "c1", Seat: fmt.Sprintf("%s-%016x", tunnel, i), First: t0, Last: t0}
			seat, err := db.RememberCall(ctx, rec)
			if err != nil {
				t.Error(err)
			}
			seats[i] = seat
		})
	}
	close(start)
	wg.Wait()
	kept, err := db.CallSeat(ctx, tunnel, "c1")
	if err != nil {
		t.Fatal(err)
	}
	for i, seat := range seats {
		if seat != kept {
			t.Errorf("caller %d was told %q, but the call is kept for %q", i, seat, kept)
		}
	}
}
