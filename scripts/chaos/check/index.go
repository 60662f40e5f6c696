package check

import (
	"cmp"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/calltap/calltap/relay/api"
	"github.com/calltap/calltap/scripts/chaos/history"
)

// index holds the history's records grouped by delivery id, read-only once
// built. Slices hold positions in the history's own slices.
type index struct {
	h        *history.History
	order    []string         // delivery ids, in the order of their first send
	sends    map[string][]int // delivery id -> h.Sends positions, by sent_at
	copies   map[string][]int // delivery id -> h.Handler positions, in handler order
	captures map[string][]int // delivery id -> h.Store positions, by received_at
	tunnel   map[string]string
	// answered maps a send answered 2xx to the handler copy whose status
	// and body it carries (-1: none); only sends with a 2xx are in it.
	answered map[int]int
	oks      []int64         // the times of every 2xx answer, sorted
	crashes  []history.Fault // the faults that may make the handler see a request again
	paths    []history.Fault // the faults that may cut a request from its answer
}

func newIndex(h *history.History) *index {
	ix := &index{h: h, sends: map[string][]int{}, copies: map[string][]int{},
		captures: map[string][]int{}, tunnel: map[string]string{}, answered: map[int]int{}}
	for i, s := range h.Sends {
		if _, ok := ix.sends[s.DeliveryID]; !ok {
			ix.tunnel[s.DeliveryID] = s.Tunnel
		}
		ix.sends[s.DeliveryID] = append(ix.sends[s.DeliveryID], i)
	}
	for d, ss := range ix.sends {
		slices.SortStableFunc(ss, func(a, b int) int { return cmp.Compare(h.Sends[a].SentAt, h.Sends[b].SentAt) })
		ix.order = append(ix.order, d)
	}
	slices.SortFunc(ix.order, func(a, b string) int {
		return cmp.Or(cmp.Compare(h.Sends[ix.sends[a][0]].SentAt, h.Sends[ix.sends[b][0]].SentAt), cmp.Compare(a, b))
	})
	for i, c := range h.Handler {
		ix.copies[c.DeliveryID] = append(ix.copies[c.DeliveryID], i)
	}
	for i, c := range h.Store {
		ix.captures[c.DeliveryID] = append(ix.captures[c.DeliveryID], i)
	}
	for _, cs := range ix.captures {
		slices.SortStableFunc(cs, func(a, b int) int { return cmp.Compare(h.Store[a].ReceivedAt, h.Store[b].ReceivedAt) })
	}
	for i, s := range h.Sends {
		if is2xx(s.Status) {
			ix.answered[i] = ix.handlerCopyOf(i)
			ix.oks = append(ix.oks, s.AnsweredAt)
		}
	}
	slices.Sort(ix.oks)
	for _, f := range h.Faults {
		if isCrash(f) {
			ix.crashes = append(ix.crashes, f)
		}
		if f.Kind != history.FaultDiskFull {
			ix.paths = append(ix.paths, f)
		}
	}
	return ix
}

// isCrash reports whether f can make the handler see a request again: a
// SIGKILL or power cut of anything, or a SIGTERM of a relay node ("relay",
// "relay-2": it may hold the tunnel, and gives up on requests in flight
// after its grace).
// An agent's SIGTERM is an orderly stop and loses no answer, so it is not
// one.
func isCrash(f history.Fault) bool {
	switch f.Kind {
	case history.FaultSigkill, history.FaultPowerCut:
		return true
	case history.FaultSigterm:
		return strings.HasPrefix(f.Target, "relay") && !strings.Contains(f.Target, "->")
	}
	return false
}

// handlerCopyOf finds the handler copy whose answer send i carries: a copy
// of the same delivery, received no later than the answer, with the same
// status and body (the sender keeps the first 4 KiB of a body). -1 if none.
func (ix *index) handlerCopyOf(i int) int {
	s := ix.h.Sends[i]
	for _, ci := range ix.copies[s.DeliveryID] {
		c := ix.h.Handler[ci]
		if c.ReceivedAt <= s.AnsweredAt && c.Status == s.Status && sameBody(s.Body, c.AnswerBody) {
			return ci
		}
	}
	return -1
}

// sentBodyMax is how much of an answer's body a sender records.
const sentBodyMax = 4096

func sameBody(sent, handler string) bool {
	if len(handler) > sentBodyMax && len(sent) == sentBodyMax {
		return handler[:sentBodyMax] == sent
	}
	return sent == handler
}

// describeEvent names d's event and call, and the developer its body
// named, if any (named): "call.ended of call c1 (naming developer bob)".
func (ix *index) describeEvent(d string) (what string, named bool) {
	s := ix.h.Sends[ix.sends[d][0]]
	what = s.Event + " of call " + s.CallID
	if s.Developer == "" {
		return what, false
	}
	return what + " (naming developer " + s.Developer + ")", true
}

// accepted is the position of the first send of d answered 2xx (202
// included), by answer time; -1 if none.
func (ix *index) accepted(d string) int {
	best := -1
	for _, i := range ix.sends[d] {
		s := ix.h.Sends[i]
		if is2xx(s.Status) && (best < 0 || s.AnsweredAt < ix.h.Sends[best].AnsweredAt) {
			best = i
		}
	}
	return best
}

func is2xx(status int) bool { return status >= 200 && status < 300 }

// refused reports whether s got an answer that is not a 2xx.
func refused(s history.Send) bool { return s.Status != 0 && !is2xx(s.Status) }

// toldFailed reports whether s's sender was told the request failed: a
// refusal, other than one saying the outcome is unknown (unknownAnswer),
// which tells its sender no more than no answer at all.
func toldFailed(s history.Send) bool { return refused(s) && !unknownAnswer(s) }

// unknownAnswer reports whether s is a 503 with Retry-After whose envelope's
// error code is outcome_unknown: the agent could not save a request it had
// forwarded, or a relay node lost the answer of one the holding node took.
// The request may have reached the handler; the sender retries.
func unknownAnswer(s history.Send) bool {
	if (s.Status != http.StatusServiceUnavailable && s.Status != http.StatusGatewayTimeout) || s.RetryAfter == "" {
		return false
	}
	var env struct {
		Error *struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	return json.Unmarshal([]byte(s.Body), &env) == nil && env.Error != nil && env.Error.Code == api.CodeOutcomeUnknown
}

// queuedAnswer reports whether s is the relay's 202 for a request it (or
// the agent) keeps for later: the envelope with data.queued true.
func queuedAnswer(s history.Send) bool {
	if s.Status != 202 {
		return false
	}
	var env struct {
		Status bool `json:"status"`
		Data   struct {
			Queued bool `json:"queued"`
		} `json:"data"`
	}
	return json.Unmarshal([]byte(s.Body), &env) == nil && env.Status && env.Data.Queued
}

// handlerAnswer reports whether s's answer, whatever its status, is one the
// handler gave to a copy of its delivery.
func (ix *index) handlerAnswer(i int) bool {
	if ci, ok := ix.answered[i]; ok {
		return ci >= 0
	}
	return ix.handlerCopyOf(i) >= 0
}

// couldCause reports whether send i may be how copy ci reached the handler:
// it was sent before the copy arrived and either carries that copy's answer,
// or was queued (202: delivered later), or got no answer (or a 503
// outcome_unknown, unknownAnswer), or was still waiting for its answer when
// the copy arrived. A send answered 2xx with another copy's answer, or
// refused before the copy arrived, could not.
//
// A queued 202 brings a copy from a queued capture (the store marks what
// the relay queued, or the agent held behind earlier requests, queued): if
// the copy's capture (backing) was saved live, the 202 did not bring it,
// unless it was answered while the copy's agent was frozen (frozenAt).
func (ix *index) couldCause(i, ci int) bool {
	s, c := ix.h.Sends[i], ix.h.Handler[ci]
	if s.SentAt > c.ReceivedAt {
		return false
	}
	if m, ok := ix.answered[i]; ok && m >= 0 {
		return m == ci
	}
	if queuedAnswer(s) {
		return !ix.cameLive(ci) || ix.frozenAt(i, ci)
	}
	return !toldFailed(s) || s.AnsweredAt+stampSlack >= c.ReceivedAt
}

// frozenAt reports whether the agent whose handler got copy ci could have
// been taken for frozen when send i was answered: it was stopped
// (SIGSTOP), or its link to the relay slowed or black-holed, so that its
// pongs were late by the relay's 3 s. The relay takes such an agent for
// away: the requests in flight to it are answered 202 and queued, yet the
// agent gets what it was sent before first, live, each once (calltap help
// stopping). A slowed link holds what it carries for a while after it
// heals: the verdict may come up to pongSlack later.
func (ix *index) frozenAt(i, ci int) bool {
	proc := "agent"
	if seat := ix.h.Handler[ci].Seat; seat != "" {
		proc = history.ClaimantProc(seat)
	}
	at := ix.h.Sends[i].AnsweredAt
	for _, f := range ix.h.Faults {
		if silences(f, proc) && f.Start <= at && (f.End == 0 || at <= f.End+int64(pongSlack)) {
			return true
		}
	}
	return false
}

// pongSlack is how long after a slowed link heals a pong it held may still
// be on its way: the longest delay the nemesis sets each way, twice.
const pongSlack = 6 * time.Second

// silences reports whether fault f can keep agent proc's pongs from the
// relay: proc stopped, or its links to the relay slowed or black-holed.
func silences(f history.Fault, proc string) bool {
	switch f.Kind {
	case history.FaultSigstop:
		return f.Target == proc
	case history.FaultNetSlow, history.FaultNetCut:
		return strings.HasPrefix(f.Target, proc+"->relay")
	}
	return false
}

// firstCause is when the earliest send of d that could have caused copy ci
// was sent.
func (ix *index) firstCause(d string, ci int) (int64, bool) {
	for _, i := range ix.sends[d] { // by sent_at
		if ix.couldCause(i, ci) {
			return ix.h.Sends[i].SentAt, true
		}
	}
	return 0, false
}

// stampSlack is how far apart two stamps of one moment may be: the handler
// stamps a copy after reading its body and taking its log's lock, a sender
// stamps an answer after reading it, and on a busy 2-core machine either
// may wait for the scheduler. A refusal stamped less than this before a
// copy arrived is taken as given while the copy was on its way.
const stampSlack = int64(50 * time.Millisecond)

// notRefusedBefore reports whether send i, sent by the time copy ci
// arrived, was not refused before it (a 503 outcome_unknown is no refusal:
// see toldFailed), and, if it was a queued 202, the copy did not come
// live: a send that may be how the copy came.
func (ix *index) notRefusedBefore(i, ci int) bool {
	s, c := ix.h.Sends[i], ix.h.Handler[ci]
	if s.SentAt > c.ReceivedAt || (toldFailed(s) && s.AnsweredAt+stampSlack < c.ReceivedAt) {
		return false
	}
	return !queuedAnswer(s) || !ix.cameLive(ci) || ix.frozenAt(i, ci)
}

// backingSkew allows for the store's microseconds: the agent stamps a
// capture when the request arrives, before it goes to the handler.
const backingSkew = int64(time.Millisecond)

// backing finds the capture saved for copy ci: its delivery's latest
// capture received by the copy's arrival; -1 if none (lost, or not read).
func (ix *index) backing(ci int) int {
	c := ix.h.Handler[ci]
	return ix.captureFor(c.DeliveryID, c.ReceivedAt, backingSkew)
}

// cameLive reports whether copy ci's capture was saved live, not queued.
func (ix *index) cameLive(ci int) bool {
	p := ix.backing(ci)
	return p >= 0 && !ix.h.Store[p].Queued
}

// captureFor is the latest capture of d received by t (give or take
// skew); -1 if none.
func (ix *index) captureFor(d string, t, skew int64) int {
	best := -1
	for _, p := range ix.captures[d] {
		if ix.h.Store[p].ReceivedAt <= t+skew {
			best = p
		}
	}
	return best
}

// A fault's effects outlast it: a link restored or a process continued
// leaves connections to be noticed dead and agents to reconnect (the
// README: agents leave a frozen node within 10 s). A fault's start is
// recorded by the nemesis when it acts, a hair from when it bites.
const (
	faultSlack = int64(10 * time.Second)
	startSlack = int64(time.Second)
)

// overlaps reports whether one of fs was under way at some moment of
// [from, to]: started by to (give or take startSlack) and not over, with
// faultSlack, before from.
func overlaps(fs []history.Fault, from, to int64) bool {
	for _, f := range fs {
		if f.Start-startSlack <= to && (f.End == 0 || f.End+faultSlack >= from) {
			return true
		}
	}
	return false
}

func runEnd(h *history.History) int64 {
	return max(h.Meta.Ended, h.Meta.Started)
}
