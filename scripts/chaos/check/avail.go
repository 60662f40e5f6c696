package check

import (
	"slices"
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

// measure computes the waits of the attempts sent in [from, to] and the
// longest stretch of that window without a 2xx answer, against the
// history's bounds.
func measure(ix *index, from, to int64) Waits {
	var w Waits
	var waits []time.Duration
	for _, s := range ix.h.Sends {
		if s.SentAt < from || s.SentAt > to {
			continue
		}
		w.Attempts++
		if s.Status == 0 || s.AnsweredAt == 0 {
			w.NoAnswer++
			continue
		}
		waits = append(waits, time.Duration(s.AnsweredAt-s.SentAt))
	}
	slices.Sort(waits)
	if n := len(waits); n > 0 {
		w.P50, w.P99, w.Max = rank(waits, 0.50), rank(waits, 0.99), waits[n-1]
	}
	w.No2xx, w.No2xxFrom = longestGap(ix.oks, from, to)
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
