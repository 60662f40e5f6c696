// Several agents on one token, each by what it claims: the seats, how a
// request finds its seat, and the memory of which seat each call is with.
//
// A token's default seat is its tunnel. A claimant's seat is registered in
// the Store when its agent first connects with claims (registerSeat), and
// stays registered while that agent is away, its requests queued for it,
// until `calltap relay claims release` removes it or it has been away for
// Config.ClaimTTL. Every node reads the registry again every
// revokeEvery (syncSeats); the node an agent connects to knows its seat at
// once.
//
// A request of a token with claimant seats goes to the seat of its call
// (call.call_id), which the call's first event decided and the Store
// remembers until Config.CallMemory after the call's last event; a
// call's first event, or a request that names no call, goes to the oldest
// seat with a claim it matches, or else to the default seat. A token with
// no claimant seat reads no body.

package relay

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/calltap/calltap/relay/api"
	"github.com/calltap/calltap/relay/claim"
	"github.com/calltap/calltap/relay/wire"
	"github.com/calltap/calltap/storage/relaystate"
)

// callTouchEvery is how often a call's record in the Store is told of its
// later events: a call is forgotten CallMemory after its last event, give
// or take this much.
const callTouchEvery = 10 * time.Minute

// claimants returns the token's claimant seats, oldest first.
func (t *tunnel) claimants() []*tunnel {
	if p := t.seats.Load(); p != nil {
		return *p
	}
	return nil
}

// seatOrDefault returns the seat of base named id; the default seat when
// id names none (a seat released since a call was remembered for it).
func (t *tunnel) seatOrDefault(id string) *tunnel {
	for _, st := range t.claimants() {
		if st.id == id {
			return st
		}
	}
	return t
}

// matchSeat returns the oldest of seats with a claim r matches, or base.
func matchSeat(base *tunnel, seats []*tunnel, r *claim.Request) *tunnel {
	for _, st := range seats {
		if st.claims.Matches(r) {
			return st
		}
	}
	return base
}

// seatOf returns the seat of req, a request for the token's default seat
// base. An error is the Store's: the sender is told to retry rather than
// have its call handed to the wrong agent.
func (s *Server) seatOf(ctx context.Context, base *tunnel, req *wire.Request) (*tunnel, *api.Error) {
	seats := base.claimants()
	if len(seats) == 0 {
		return base, nil
	}
	cr := claim.NewRequest(req.Body, req.Header.Get)
	callID := cr.CallID()
	if callID == "" {
		return matchSeat(base, seats, cr), nil
	}
	now := time.Now()
	if id, touch, ok := s.calls.get(base.id, callID, now); ok {
		if touch {
			s.touchCall(ctx, base, callID, id, now)
		}
		return s.callSeat(ctx, base, callID, id, now), nil
	}
	id, err := s.cfg.Store.CallSeat(ctx, base.id, callID)
	if errors.Is(err, relaystate.ErrNotFound) {
		// The call's first event: its claimant is whoever it matches.
		// Another node may be remembering it at the same moment; the
		// Store keeps one seat for both.
		rec := relaystate.CallRecord{TunnelID: base.id, CallID: callID, Seat: matchSeat(base, seats, cr).id, First: now, Last: now}
		id, err = s.cfg.Store.RememberCall(ctx, rec)
	}
	if err != nil {
		s.log.Error("call memory", "tunnel", base.id, "err", err)
		return nil, api.Errorf(http.StatusServiceUnavailable, api.CodeUnavailable, "the relay could not read which agent this call belongs to; retry")
	}
	s.calls.put(base.id, callID, id, now)
	return s.callSeat(ctx, base, callID, id, now), nil
}

// callSeat is seatNamed for a call remembered for seat id. A call whose
// seat was released goes to the default from then on, and the cache says
// so: its later events do not look the registry up again each.
func (s *Server) callSeat(ctx context.Context, base *tunnel, callID, id string, now time.Time) *tunnel {
	st := s.seatNamed(ctx, base, id)
	if st == base && id != base.id {
		s.calls.put(base.id, callID, base.id, now)
	}
	return st
}

// seatNamed returns base's seat id: one another node registered a moment
// ago is looked for in the registry; one released since is the default.
func (s *Server) seatNamed(ctx context.Context, base *tunnel, id string) *tunnel {
	if st := base.seatOrDefault(id); st != base || id == base.id {
		return st
	}
	if st, err := s.lookupSeat(ctx, base.id, id); err == nil && st != nil {
		return st
	}
	return base
}

// touchCall tells the Store a known call had another event.
func (s *Server) touchCall(ctx context.Context, base *tunnel, callID, seat string, now time.Time) {
	rec := relaystate.CallRecord{TunnelID: base.id, CallID: callID, Seat: seat, First: now, Last: now}
	if _, err := s.cfg.Store.RememberCall(ctx, rec); err != nil {
		s.log.Warn("call memory: could not note a call's later event; it is forgotten sooner", "tunnel", base.id, "err", err)
	}
}

// callCache is the calls this node looked up or remembered lately: a
// call's later events find their seat without a round trip to the Store.
// A call's seat never changes once remembered, so a stale entry is never
// wrong. Two generations bound it: when the current one is full it
// becomes the old one, and what the old one held is dropped.
type callCache struct {
	mu  sync.Mutex
	cur map[callKey]callEntry // guarded by mu
	old map[callKey]callEntry // guarded by mu
}

// callCacheGeneration bounds each generation of callCache.
const callCacheGeneration = 1 << 15

type callKey struct{ tunnel, call string }

type callEntry struct {
	seat    string
	touched time.Time // when the Store's record of the call last had its Last set, as far as this node knows
}

// get returns the seat of a call and whether its record is due a touch
// (which it then counts as done).
func (c *callCache) get(tunnelID, callID string, now time.Time) (seat string, touch, ok bool) {
	k := callKey{tunnelID, callID}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.cur[k]
	if !ok {
		if e, ok = c.old[k]; !ok {
			return "", false, false
		}
	}
	if touch = now.Sub(e.touched) >= callTouchEvery; touch {
		e.touched = now
	}
	c.putLocked(k, e)
	return e.seat, touch, true
}

func (c *callCache) put(tunnelID, callID, seat string, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.putLocked(callKey{tunnelID, callID}, callEntry{seat: seat, touched: now})
}

func (c *callCache) putLocked(k callKey, e callEntry) {
	if _, ok := c.cur[k]; !ok && len(c.cur) >= callCacheGeneration || c.cur == nil {
		c.old, c.cur = c.cur, make(map[callKey]callEntry)
	}
	c.cur[k] = e
}

// registerSeat returns the seat an agent's handshake asks for: the token's
// default seat when it claims nothing, or else the seat of its claims,
// registered in the Store (connected) before the agent takes it. A claim
// set sharing a claim with another seat of the token, or taking the token
// past Config.MaxClaims, is refused (409).
func (s *Server) registerSeat(ctx context.Context, hs *handshake) (*tunnel, *api.Error) {
	base := s.tunnelFor(hs.tok.TunnelID, hs.tok.Name)
	if len(hs.claims) == 0 {
		return base, nil
	}
	id := claim.SeatID(base.id, hs.claims)
	s.seatsMu.Lock()
	defer s.seatsMu.Unlock()
	if e := s.checkClaims(base, id, hs.claims); e != nil {
		return nil, e
	}
	now := time.Now()
	rec := &relaystate.Claimant{TunnelID: base.id, Seat: id, Claims: hs.claims.Strings(), CreatedAt: now, SeenAt: now, Connected: true}
	if err := s.cfg.Store.SaveClaimant(ctx, rec); err != nil {
		s.log.Error("register claims", "tunnel", base.id, "seat", id, "err", err)
		return nil, api.Errorf(http.StatusServiceUnavailable, api.CodeUnavailable, "the relay could not register this agent's claims; retry")
	}
	st := base.seatOrDefault(id)
	if st == base {
		s.registeredAt(ctx, rec)
		st = s.seatTunnel(base, rec, hs.claims)
		s.storeSeats(base, append(slices.Clip(base.claimants()), st))
	}
	s.nameSeat(st, hs.tok.Name)
	return st, nil
}

// registeredAt sets rec.CreatedAt to the registry's, which keeps the first
// registration's: a seat registered before, and new to this node, must be
// ordered here as on every other node.
func (s *Server) registeredAt(ctx context.Context, rec *relaystate.Claimant) {
	if r, err := s.registered(ctx, rec.Seat); err == nil && r != nil {
		rec.CreatedAt = r.CreatedAt
	}
}

// nameSeat gives st its token's name. A seat read from the registry
// before any agent of its token connected (a relay starting) was made
// without it, and its agents' hellos would name no token. Written only
// when it differs, as tunnelFor writes a token's name.
func (s *Server) nameSeat(st *tunnel, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st.name != name {
		st.name = name
	}
}

// checkClaims refuses a claim set another seat of base shares a claim
// with, or that takes base past its claim limit. s.seatsMu is held.
func (s *Server) checkClaims(base *tunnel, id string, claims claim.Set) *api.Error {
	n := len(claims)
	for _, st := range base.claimants() {
		if st.id == id {
			continue // the same seat: the newer agent run takes it over
		}
		if c, shared := claims.Shares(st.claims); shared {
			return api.Errorf(http.StatusConflict, api.CodeClaimConflict,
				"the claim %s is held by another agent of token %s, whose claims are %s (seat %s): stop that agent, or release its seat with `calltap relay claims release %s`",
				c, base.name, strings.Join(st.claims.Strings(), " "), st.id, st.id)
		}
		n += len(st.claims)
	}
	if n > s.cfg.MaxClaims {
		return api.Errorf(http.StatusConflict, api.CodeClaimConflict,
			"token %s would hold %d claims with this agent's; this relay takes at most %d per token (calltap relay --max-claims): release seats you no longer use (calltap relay claims)",
			base.name, n, s.cfg.MaxClaims)
	}
	return nil
}

// seatTunnel returns the seat rec names, made if this node has none yet.
func (s *Server) seatTunnel(base *tunnel, rec *relaystate.Claimant, claims claim.Set) *tunnel {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.tunnels[rec.Seat]
	if st == nil {
		st = s.newTunnel(rec.Seat, base.name)
		st.base, st.claims, st.created = base, claims, rec.CreatedAt
		s.tunnels[rec.Seat] = st
	}
	return st
}

// storeSeats makes seats base's claimant seats, oldest first (ties by id,
// as every node orders them). s.seatsMu is held.
func (s *Server) storeSeats(base *tunnel, seats []*tunnel) {
	slices.SortFunc(seats, func(a, b *tunnel) int {
		if c := a.created.Compare(b.created); c != 0 {
			return c
		}
		return strings.Compare(a.id, b.id)
	})
	if len(seats) == 0 {
		base.seats.Store(nil)
		return
	}
	base.seats.Store(&seats)
}

// syncSeats reads the registry of claimant seats from the Store: seats
// other nodes registered join, and seats released (or expired) leave,
// their agents sent away.
func (s *Server) syncSeats(ctx context.Context) {
	// The agents of released seats are sent away after seatsMu is let
	// go: a goaway may wait seconds for a frozen agent.
	for _, g := range s.syncSeatsLocked(ctx) {
		g.ac.goAway(wire.GoAway{Reason: wire.GoAwayRevoked, Message: fmt.Sprintf("this agent's seat on token %s was released (calltap relay claims release, or away longer than the relay's --claim-ttl)", g.token)})
	}
}

// releasedAgent is the agent of a seat released, to be sent away.
type releasedAgent struct {
	ac    *agentConn
	token string
}

// syncSeatsLocked does syncSeats's reading and replacing under seatsMu,
// and returns the agents of the seats that left.
func (s *Server) syncSeatsLocked(ctx context.Context) (gone []releasedAgent) {
	// The registry is read under seatsMu: a read from before a seat
	// registered here (registerSeat) must not find it missing after.
	s.seatsMu.Lock()
	defer s.seatsMu.Unlock()
	recs, err := s.cfg.Store.Claimants(ctx)
	if err != nil {
		s.log.Warn("read the registry of claims", "err", err)
		return nil
	}
	byTunnel := map[string][]*relaystate.Claimant{}
	for _, r := range recs {
		byTunnel[r.TunnelID] = append(byTunnel[r.TunnelID], r)
	}
	for id := range byTunnel {
		if !validTunnelID(id) {
			continue // a seat's id would look its registry up again, under seatsMu
		}
		if _, err := s.lookupTunnel(ctx, id); err != nil {
			return nil
		}
	}
	for _, base := range s.snapshotTunnels() {
		if base.base == base && (len(byTunnel[base.id]) > 0 || len(base.claimants()) > 0) {
			gone = append(gone, s.setSeats(base, byTunnel[base.id])...)
		}
	}
	return gone
}

// setSeats makes recs base's claimant seats, unless they are already.
// s.seatsMu is held.
func (s *Server) setSeats(base *tunnel, recs []*relaystate.Claimant) (released []releasedAgent) {
	old := base.claimants()
	listed := make(map[string]bool, len(recs))
	for _, r := range recs {
		listed[r.Seat] = true
	}
	seats := make([]*tunnel, 0, len(recs))
	var gone []*tunnel
	for _, st := range old {
		// A seat registered here a moment ago may not be in a cluster's
		// mirror of the registry yet: it leaves only once it has been
		// missing from a few reads in a row. A single node's registry is
		// its own database, and a seat missing from it is released: it
		// leaves at once, or its requests would queue where no agent
		// drains them.
		switch {
		case listed[st.id]:
			st.missing = 0
		case s.shared && st.missing+1 < seatMissingReads:
			st.missing++
			seats = append(seats, st)
		default:
			gone = append(gone, st)
		}
	}
	if len(gone) == 0 && len(seats) == 0 && len(recs) == len(old) {
		return nil // every seat here is listed, and no other
	}
	for _, rec := range recs {
		claims, err := claim.ParseSet(rec.Claims)
		if err != nil || claim.SeatID(base.id, claims) != rec.Seat {
			s.log.Error("a registered seat's claims do not parse; ignoring it", "seat", rec.Seat, "claims", rec.Claims, "err", err)
			continue
		}
		seats = append(seats, s.seatTunnel(base, rec, claims))
	}
	s.storeSeats(base, seats)
	for _, st := range gone {
		s.log.Info("seat released", "tunnel", base.id, "seat", st.id, "claims", strings.Join(st.claims.Strings(), " "))
		if ac := s.forgetSeat(st); ac != nil {
			released = append(released, releasedAgent{ac, base.name})
		}
	}
	return released
}

// forgetSeat takes a released seat off this node and returns its agent, if
// one holds it here, to be sent away.
func (s *Server) forgetSeat(st *tunnel) *agentConn {
	s.mu.Lock()
	if s.tunnels[st.id] == st {
		delete(s.tunnels, st.id)
	}
	s.mu.Unlock()
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.agent
}

// seatMissingReads is how many reads of the registry in a row must miss a
// seat before this node lets it go.
const seatMissingReads = 3

// lookupSeat returns the claimant seat id of token tunnelID; nil when no
// such seat is registered.
func (s *Server) lookupSeat(ctx context.Context, tunnelID, id string) (*tunnel, error) {
	base, err := s.lookupTunnel(ctx, tunnelID)
	if base == nil || err != nil {
		return nil, err
	}
	if st := base.seatOrDefault(id); st != base {
		return st, nil
	}
	s.syncSeats(ctx) // registered on another node a moment ago
	if st := base.seatOrDefault(id); st != base {
		return st, nil
	}
	return nil, nil
}

// leaveSeat marks a claimant seat away in the registry once no agent holds
// or takes it here: its claims stay, and its requests queue for it. A seat
// the registry no longer lists stays unlisted: it was released, and its
// agent sent away for that; saving it would register it again, and its
// claims' calls would queue for an agent told to go.
func (s *Server) leaveSeat(t *tunnel) {
	if t.base == t {
		return
	}
	ctx := context.Background()
	s.seatsMu.Lock() // registerSeat's and syncSeats' reads and writes of the registry are whole
	defer s.seatsMu.Unlock()
	if t.counts() {
		return
	}
	rec, err := s.registered(ctx, t.id)
	if rec == nil {
		if err != nil {
			s.log.Warn("could not mark a claimant away in the registry", "seat", t.id, "err", err)
		}
		return
	}
	rec.SeenAt, rec.Connected = time.Now(), false
	if err := s.cfg.Store.SaveClaimant(ctx, rec); err != nil {
		s.log.Warn("could not mark a claimant away in the registry", "seat", t.id, "err", err)
	}
}

// registered returns the registry's record of seat; nil when it lists none.
func (s *Server) registered(ctx context.Context, seat string) (*relaystate.Claimant, error) {
	recs, err := s.cfg.Store.Claimants(ctx)
	if err != nil {
		return nil, err
	}
	for _, r := range recs {
		if r.Seat == seat {
			return r, nil
		}
	}
	return nil, nil
}

// expireClaims releases the seats away longer than Config.ClaimTTL and
// forgets the calls whose last event is older than Config.CallMemory.
func (s *Server) expireClaims(ctx context.Context) {
	now := time.Now()
	if n, err := s.cfg.Store.ExpireCalls(ctx, now.Add(-s.cfg.CallMemory)); err != nil {
		s.log.Warn("expire the call memory", "err", err)
	} else if n > 0 {
		s.log.Debug("calls forgotten", "count", n)
	}
	recs, err := s.cfg.Store.Claimants(ctx)
	if err != nil {
		return
	}
	for _, r := range recs {
		if s.awayTooLong(r, now) {
			s.expireSeat(ctx, r.Seat, now)
		}
	}
}

// awayTooLong reports whether r, a seat's record, says its agent has been
// away longer than Config.ClaimTTL.
func (s *Server) awayTooLong(r *relaystate.Claimant, now time.Time) bool {
	return r != nil && !r.Connected && now.Sub(r.SeenAt) >= s.cfg.ClaimTTL
}

// expireSeat releases seat if it is still away too long once s.seatsMu is
// held (no agent registers it meanwhile), and takes it off its token here
// at once: a request for it from then on is its token's default's, never
// queued for a seat that is gone, where no agent would drain it.
//
// A record's Connected may lag: a run taken over from marks its seat away
// as it leaves, after the run that took it over marked it connected. Who
// holds the seat is what counts; one held here is marked connected again.
func (s *Server) expireSeat(ctx context.Context, seat string, now time.Time) {
	s.seatsMu.Lock()
	defer s.seatsMu.Unlock()
	r, err := s.registered(ctx, seat)
	switch {
	case err != nil || !s.awayTooLong(r, now):
		return
	case s.heldHere(seat):
		s.markHeld(ctx, r)
		return
	case s.cfg.Cluster.Holder(seat).Node != "":
		return // held on another node, which keeps its record
	}
	n, err := s.cfg.Store.ReleaseClaimant(ctx, seat)
	if err != nil && !errors.Is(err, relaystate.ErrNotFound) {
		s.log.Warn("release an expired seat", "seat", seat, "err", err)
		return
	}
	s.dropSeat(r.TunnelID, seat)
	// No agent holds it to be sent away: this forgets its tunnel.
	s.sendAway(seat, true, wire.GoAway{Reason: wire.GoAwayRevoked, Message: "this agent's seat was released: away longer than the relay's --claim-ttl"})
	s.log.Warn("seat away longer than the claim TTL released", "seat", seat, "claims", strings.Join(r.Claims, " "), "away_since", r.SeenAt, "dropped_queued", n)
}

// heldHere reports whether an agent holds seat here, or is taking it.
func (s *Server) heldHere(seat string) bool {
	s.mu.Lock()
	t := s.tunnels[seat]
	s.mu.Unlock()
	return t != nil && t.counts()
}

// markHeld marks r, a seat an agent holds here, connected in the registry
// again. s.seatsMu is held: leaveSeat marks it away after, not before.
func (s *Server) markHeld(ctx context.Context, r *relaystate.Claimant) {
	r.Connected, r.SeenAt = true, time.Now()
	if err := s.cfg.Store.SaveClaimant(ctx, r); err != nil {
		s.log.Warn("could not mark a claimant connected in the registry", "seat", r.Seat, "err", err)
	}
}

// dropSeat takes seat off the claimant seats of token tunnelID here.
// s.seatsMu is held.
func (s *Server) dropSeat(tunnelID, seat string) {
	s.mu.Lock()
	base := s.tunnels[tunnelID]
	s.mu.Unlock()
	if base == nil {
		return
	}
	seats := slices.DeleteFunc(slices.Clone(base.claimants()), func(st *tunnel) bool { return st.id == seat })
	s.storeSeats(base, seats)
}

// awayOnStart marks every seat away on a relay that is the only node: no
// agent is connected to it yet, whatever the registry said when it
// stopped.
func (s *Server) awayOnStart(ctx context.Context) error {
	if s.shared {
		return nil
	}
	recs, err := s.cfg.Store.Claimants(ctx)
	if err != nil {
		return err
	}
	now := time.Now()
	for _, r := range recs {
		if r.Connected {
			// Its agent was here until this relay stopped, however
			// long ago it connected: its time away counts from now.
			r.Connected, r.SeenAt = false, now
			if err := s.cfg.Store.SaveClaimant(ctx, r); err != nil {
				return err
			}
		}
	}
	return nil
}
