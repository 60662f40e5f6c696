package cluster_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/calltap/calltap/relay/cluster"
	"github.com/calltap/calltap/relay/cluster/natstest"
	"github.com/calltap/calltap/relay/polltest"
	"github.com/calltap/calltap/storage/relaystate"
	"github.com/google/uuid"
)

// openStore opens a cluster node without a relay in front: the store, as
// the relay uses it, closed at the test's end.
func openStore(t *testing.T, nats *natstest.Cluster, name string) *cluster.Cluster {
	t.Helper()
	c, err := cluster.Open(context.Background(), storeOptions(t, nats, name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func storeOptions(t *testing.T, nats *natstest.Cluster, name string) cluster.Options {
	return cluster.Options{URLs: nats.URLs(), Replicas: 3, Node: name, Logger: testLogger(t, "node "+name), RequestTimeout: 2 * time.Second}
}

// A token's tunnel id and two claimant seats of it, as the relay names them.
const (
	testTunnel = "0123456789abcdefghij"
	seatAlice  = testTunnel + "-00000000000000a1"
	seatBob    = testTunnel + "-00000000000000b0"
)

func claimantIn(t *testing.T, c *cluster.Cluster, seat string) *relaystate.Claimant {
	t.Helper()
	recs, err := c.Claimants(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if r.Seat == seat {
			return r
		}
	}
	return nil
}

// A seat registered on one node is in every node's registry within
// moments (a mirror: no round trip), at once on the node that saved it;
// another node marking it away keeps its first registration's CreatedAt
// and claims.
func TestClaimantSeenOnEveryNode(t *testing.T) {
	nats := natstest.Start(t, 3)
	a, b := openStore(t, nats, "a"), openStore(t, nats, "b")
	ctx := context.Background()
	created := time.Now().UTC().Truncate(time.Microsecond)
	rec := &relaystate.Claimant{TunnelID: testTunnel, Seat: seatAlice, Claims: []string{"call.variables.developer=alice"}, CreatedAt: created, SeenAt: created, Connected: true}
	if err := a.SaveClaimant(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if got := claimantIn(t, a, seatAlice); got == nil || !got.Connected {
		t.Fatalf("the node that saved the seat lists %+v, want it connected at once", got)
	}
	polltest.Until(t, 10*time.Second, func() bool { return claimantIn(t, b, seatAlice) != nil }, "the other node never listed the seat")

	away := created.Add(time.Hour)
	later := &relaystate.Claimant{TunnelID: testTunnel, Seat: seatAlice, Claims: []string{"call.variables.developer=mallory"}, CreatedAt: away, SeenAt: away}
	if err := b.SaveClaimant(ctx, later); err != nil {
		t.Fatal(err)
	}
	polltest.Until(t, 10*time.Second, func() bool { got := claimantIn(t, a, seatAlice); return got != nil && !got.Connected }, "the node that registered the seat never saw it away")
	got := claimantIn(t, a, seatAlice)
	if !got.CreatedAt.Equal(created) || !got.SeenAt.Equal(away) || !slices.Equal(got.Claims, rec.Claims) || got.TunnelID != testTunnel {
		t.Errorf("the seat marked away reads %+v, want created %v, seen %v, claims %v", got, created, away, rec.Claims)
	}
}

// Registrations racing on one seat from two nodes all land, and the seat
// keeps one CreatedAt.
func TestClaimantSavesRaced(t *testing.T) {
	nats := natstest.Start(t, 3)
	nodes := []*cluster.Cluster{openStore(t, nats, "a"), openStore(t, nats, "b")}
	start := time.Now().UTC().Truncate(time.Microsecond)
	errs := make(chan error, 16)
	for i := range 16 {
		go func() {
			at := start.Add(time.Duration(i) * time.Second)
			errs <- nodes[i%2].SaveClaimant(context.Background(), &relaystate.Claimant{TunnelID: testTunnel, Seat: seatBob, Claims: []string{"header:X-Dev=bob"}, CreatedAt: at, SeenAt: at, Connected: i%2 == 0})
		}()
	}
	for range 16 {
		if err := <-errs; err != nil {
			t.Fatalf("a raced registration: %v", err)
		}
	}
	var created []time.Time
	for _, c := range nodes {
		polltest.Until(t, 10*time.Second, func() bool { return claimantIn(t, c, seatBob) != nil }, "a node never listed the seat")
		created = append(created, claimantIn(t, c, seatBob).CreatedAt)
	}
	recs, _ := nodes[0].Claimants(context.Background())
	if len(recs) != 1 || !created[0].Equal(created[1]) {
		t.Errorf("after raced registrations: %d seats, created %v, want one seat of one CreatedAt", len(recs), created)
	}
}

func queued(t *testing.T, c *cluster.Cluster, seat string, body []byte) {
	t.Helper()
	q := &relaystate.QueuedRequest{ID: uuid.NewString(), TunnelID: seat, ArrivedAt: time.Now().UnixMicro(),
		Method: http.MethodPost, URI: "/", Headers: []byte{0}, Body: body}
	if err := c.Enqueue(context.Background(), q); err != nil {
		t.Fatal(err)
	}
}

func queueCount(t *testing.T, c *cluster.Cluster, seat string) int {
	t.Helper()
	st, err := c.TunnelQueueStats(context.Background(), seat)
	if err != nil {
		t.Fatal(err)
	}
	return st.Count
}

// bodyChunks counts the chunks of queued bodies too large for a message.
func bodyChunks(t *testing.T, nats *natstest.Cluster) uint64 {
	t.Helper()
	st, err := testJetStream(t, nats).Stream(context.Background(), "CALLTAP_BODIES")
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// Releasing a seat removes it from every node's registry, and its queue
// with the chunks of its large bodies; the queues of the token's other
// seats stay as they were. A seat released, or never registered, is not
// found.
func TestReleaseClaimantPurgesItsQueueOnly(t *testing.T) {
	nats := natstest.Start(t, 3)
	a, b := openStore(t, nats, "a"), openStore(t, nats, "b")
	ctx := context.Background()
	now := time.Now().UTC()
	for _, seat := range []string{seatAlice, seatBob} {
		if err := a.SaveClaimant(ctx, &relaystate.Claimant{TunnelID: testTunnel, Seat: seat, Claims: []string{"call.variables.developer=" + seat}, CreatedAt: now, SeenAt: now}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		queued(t, a, seatAlice, fmt.Appendf(nil, `{"n":%d}`, i))
	}
	queued(t, b, seatAlice, bytes.Repeat([]byte("a"), 2<<20)) // in chunks: larger than a NATS message
	queued(t, b, seatBob, []byte(`{"bob":1}`))
	queued(t, a, testTunnel, []byte(`{"default":1}`))
	queued(t, a, testTunnel, []byte(`{"default":2}`))
	if n := bodyChunks(t, nats); n == 0 {
		t.Fatal("the large body is not in chunks: the test does not test their release")
	}

	n, err := b.ReleaseClaimant(ctx, seatAlice)
	if err != nil {
		t.Fatal(err)
	}
	if n != 4 {
		t.Errorf("the release dropped %d queued requests, want the seat's 4", n)
	}
	if got := queueCount(t, a, seatAlice); got != 0 {
		t.Errorf("the released seat still has %d queued", got)
	}
	if got, other := queueCount(t, a, seatBob), queueCount(t, a, testTunnel); got != 1 || other != 2 {
		t.Errorf("the other seats hold %d and %d (the default) queued, want 1 and 2, as before the release", got, other)
	}
	if n := bodyChunks(t, nats); n != 0 {
		t.Errorf("%d chunks of the released seat's bodies are left", n)
	}
	if claimantIn(t, b, seatAlice) != nil {
		t.Error("the node that released the seat still lists it")
	}
	polltest.Until(t, 10*time.Second, func() bool { return claimantIn(t, a, seatAlice) == nil }, "the other node still lists the released seat")
	if claimantIn(t, a, seatBob) == nil {
		t.Error("the other seat left the registry with the released one")
	}
	for _, seat := range []string{seatAlice, testTunnel, "a.>"} {
		if _, err := a.ReleaseClaimant(ctx, seat); !errors.Is(err, relaystate.ErrNotFound) {
			t.Errorf("release of %q: %v, want ErrNotFound", seat, err)
		}
	}
	if got := queueCount(t, a, testTunnel); got != 2 {
		t.Errorf("releases of no seat left the default seat %d queued, want 2", got)
	}
	// Registered again, the seat is new: its first registration is now.
	again := now.Add(time.Minute)
	if err := a.SaveClaimant(ctx, &relaystate.Claimant{TunnelID: testTunnel, Seat: seatAlice, Claims: []string{"x=1"}, CreatedAt: again, SeenAt: again}); err != nil {
		t.Fatal(err)
	}
	if got := claimantIn(t, a, seatAlice); got == nil || !got.CreatedAt.Equal(again) || strings.Join(got.Claims, " ") != "x=1" {
		t.Errorf("the seat registered again reads %+v, want a new registration", got)
	}
}
