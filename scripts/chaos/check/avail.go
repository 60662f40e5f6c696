package check

import (
	"cmp"
	"slices"
	"strings"
	"time"

	"github.com/calltap/calltap/scripts/chaos/history"
)

// RecoverySlack extends a fault's window past its end: what a fault
// breaks takes a while to mend (an agent reconnects, a node restarts), and
// the senders' waits then belong to that fault.
const RecoverySlack = 10 * time.Second

// faultWindow is the span measured for f: its start to its end plus
// RecoverySlack, or to the run's end when it never ended; never past the
// run's end.
func faultWindow(h *history.History, f history.Fault) (from, to int64) {
	end := runEnd(h)
	to = end
	if f.End != 0 {
		to = min(f.End+int64(RecoverySlack), end)
	}
	return f.Start, max(to, f.Start)
}

// traffic is the attempts a window is measured over: every sender's, or,
// around a fault of one agent in a run with claimants, those of the calls
// of that agent's seat (the other agents' calls flow on, and would hide
// how long that agent's callers waited).
type traffic struct {
	sends []int   // positions in h.Sends, in order; all of them when every is set
	every bool    // the whole run's traffic
	oks   []int64 // the times of their 2xx answers, sorted
}

// allTraffic is every attempt of the run.
func allTraffic(ix *index) traffic { return traffic{every: true, oks: ix.oks} }

// seatTraffic splits the run's attempts by the seat of their call.
func seatTraffic(ix *index, s *seats) map[string]traffic {
	out := map[string]traffic{}
	for i, snd := range ix.h.Sends {
		seat := s.of(snd.DeliveryID).seat
		tr := out[seat]
		tr.sends = append(tr.sends, i)
		if is2xx(snd.Status) {
			tr.oks = append(tr.oks, snd.AnsweredAt)
		}
		out[seat] = tr
	}
	for seat, tr := range out {
		slices.Sort(tr.oks)
		out[seat] = tr
	}
	return out
}

// each calls f with every attempt of tr.
func (tr traffic) each(ix *index, f func(history.Send)) {
	if tr.every {
		for _, s := range ix.h.Sends {
			f(s)
		}
		return
	}
	for _, i := range tr.sends {
		f(ix.h.Sends[i])
	}
}

// measure computes the waits of tr's attempts sent in [from, to] and the
// longest stretch of that window without a 2xx answer among them, against
// the history's bounds.
func measure(ix *index, tr traffic, from, to int64) Waits {
	var w Waits
	var waits []time.Duration
	tr.each(ix, func(s history.Send) {
		if s.SentAt < from || s.SentAt > to {
			return
		}
		w.Attempts++
		if s.Status == 0 || s.AnsweredAt == 0 {
			w.NoAnswer++
			return
		}
		waits = append(waits, time.Duration(s.AnsweredAt-s.SentAt))
	})
	slices.Sort(waits)
	if n := len(waits); n > 0 {
		w.P50, w.P99, w.Max = rank(waits, 0.50), rank(waits, 0.99), waits[n-1]
	}
	w.No2xx, w.No2xxFrom = longestGap(tr.oks, from, to)
	b := ix.h.Meta.Bounds
	w.OverAnswer = b.AnswerMaxMS > 0 && w.Max > time.Duration(b.AnswerMaxMS)*time.Millisecond
	w.OverNo2xx = b.No2xxMaxMS > 0 && w.No2xx > time.Duration(b.No2xxMaxMS)*time.Millisecond
	return w
}

// rank is the nearest-rank percentile p of sorted ds.
func rank(ds []time.Duration, p float64) time.Duration {
	i := int(p*float64(len(ds))+0.999999) - 1
	return ds[min(max(i, 0), len(ds)-1)]
}

// longestGap is the longest stretch of [from, to] holding no time of oks
// (sorted), and where it starts.
func longestGap(oks []int64, from, to int64) (time.Duration, int64) {
	i, _ := slices.BinarySearch(oks, from)
	prev, best, at := from, int64(0), from
	for ; i < len(oks) && oks[i] <= to; i++ {
		if g := oks[i] - prev; g > best {
			best, at = g, prev
		}
		prev = oks[i]
	}
	if g := to - prev; g > best {
		best, at = g, prev
	}
	return time.Duration(best), at
}

// byKind sums fws up per fault kind and target class: the worst of each.
func byKind(fws []FaultWaits) []KindWaits {
	var out []KindWaits
	for _, fw := range fws {
		on := targetClass(fw.Fault.Target)
		i := slices.IndexFunc(out, func(k KindWaits) bool { return k.Kind == fw.Fault.Kind && k.On == on })
		if i < 0 {
			out = append(out, KindWaits{Kind: fw.Fault.Kind, On: on})
			i = len(out) - 1
		}
		k := &out[i]
		k.Faults++
		k.Max, k.No2xx = max(k.Max, fw.Max), max(k.No2xx, fw.No2xx)
		k.OverAnswer, k.OverNo2xx = k.OverAnswer || fw.OverAnswer, k.OverNo2xx || fw.OverNo2xx
	}
	slices.SortFunc(out, func(a, b KindWaits) int { return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.On, b.On)) })
	return out
}

// targetClass is the kind of thing a fault's target names: "an agent"
// ("agent", "agent-alice"), "an agent's link" ("agent-bob->relay-1"),
// "a relay node", "a relay node's link to NATS", "a NATS server" (or two).
func targetClass(target string) string {
	proc, link, isLink := strings.Cut(target, "->")
	switch {
	case strings.HasPrefix(proc, "agent") && isLink:
		return "an agent's link"
	case strings.HasPrefix(proc, "agent"):
		return "an agent"
	case strings.HasPrefix(proc, "relay") && isLink && strings.HasPrefix(link, "nats"):
		return "a relay node's link to NATS"
	case strings.HasPrefix(proc, "relay"):
		return "a relay node"
	case strings.HasPrefix(proc, "nats"):
		return "a NATS server"
	}
	return target
}
