package check

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/calltap/calltap/scripts/chaos/history"
)

// The chart's geometry, in the SVG's own units (it scales to the page).
const (
	chartW     = 1000.0
	plotLeft   = 64.0
	plotRight  = chartW - 16
	laneTop    = 4.0  // fault labels, lanes of laneH, the first nearest the plot
	laneH      = 13.0 //
	faultLanes = 5
	ansTop     = laneTop + faultLanes*laneH + 22 // and a line for the panel's title
	ansBottom  = ansTop + 190
	latTop     = ansBottom + 30
	latBottom  = latTop + 190
	axisY      = latBottom + 16
	markTop    = axisY + 10 // violation labels, lanes of laneH
	markLanes  = 4
	chartH     = markTop + markLanes*laneH + 6 // less the violation lanes unused
	maxBuckets = 600
	charW      = 5.6 // a label character's width, to keep labels apart
)

// chartView is the timeline, every coordinate computed here so that the
// template only places elements.
type chartView struct {
	W, H                       float64
	MinY                       float64 // the viewBox's top
	Left, Right                float64
	AnsTop, AnsBottom          float64
	LatTop, LatBottom          float64
	AxisY                      float64
	BandH, TickBottom          float64
	Bucket                     string // what one point stands for, e.g. "1 s"
	OK, Bad                    string // polyline points: 2xx and other answers per second
	P50, P99                   string // path data: latency per bucket (log scale)
	NoAnswer                   []dot
	BoundY                     float64 // the answer bound's height; 0 if none
	BoundLabel                 string
	XTicks, AnsTicks, LatTicks []tick
	Bands                      []band
	Marks                      []mark
}

type tick struct {
	X, Y  float64
	Label string
}

type dot struct {
	X     float64
	Title string
}

type band struct {
	X, W, LabelX, LabelY float64
	Label, Title         string
	Color                string
}

type mark struct {
	X, LabelX, LabelY float64
	Label, Title      string
}

// timeline lays out the run's answers, latency, faults and violations.
type timeline struct {
	h       *history.History
	t0, t1  int64
	step    int64 // bucket width, whole seconds
	buckets int
}

func newTimeline(h *history.History) *timeline {
	t0 := h.Meta.Started
	t1 := max(h.Meta.Ended, h.Meta.Drained)
	for _, s := range h.Sends {
		t1 = max(t1, s.AnsweredAt, s.SentAt)
	}
	for _, c := range h.Handler {
		t1 = max(t1, c.ReceivedAt)
	}
	for _, f := range h.Faults {
		t1 = max(t1, f.End, f.Start)
	}
	if t1 <= t0 {
		t1 = t0 + int64(time.Second)
	}
	sec := int64(time.Second)
	step := max(1, ((t1-t0)/maxBuckets+sec-1)/sec) * sec
	return &timeline{h: h, t0: t0, t1: t1, step: step, buckets: int((t1-t0+step-1)/step) + 1}
}

func (tl *timeline) x(t int64) float64 {
	t = min(max(t, tl.t0), tl.t1)
	return plotLeft + float64(t-tl.t0)/float64(tl.t1-tl.t0)*(plotRight-plotLeft)
}

func (tl *timeline) bucket(t int64) int { return min(max(int((t-tl.t0)/tl.step), 0), tl.buckets-1) }

// bucketX is the middle of bucket i.
func (tl *timeline) bucketX(i int) float64 { return tl.x(tl.t0 + int64(i)*tl.step + tl.step/2) }

func (tl *timeline) view(r Result) chartView {
	v := chartView{W: chartW, H: chartH, Left: plotLeft, Right: plotRight, AnsTop: ansTop, AnsBottom: ansBottom,
		LatTop: latTop, LatBottom: latBottom, AxisY: axisY,
		BandH: latBottom - ansTop, TickBottom: latBottom + 4, Bucket: fmt.Sprintf("%d s", tl.step/int64(time.Second))}
	tl.answers(&v)
	tl.latency(&v)
	v.XTicks = tl.xTicks()
	v.Bands = tl.bands()
	v.Marks = tl.marks(r.Violations)
	// Crop the label lanes nobody used.
	v.MinY, v.H = ansTop-22, markTop+6
	for _, b := range v.Bands {
		if b.Label != "" {
			v.MinY = min(v.MinY, b.LabelY-laneH+3)
		}
	}
	for _, m := range v.Marks {
		if m.Label != "" {
			v.H = max(v.H, m.LabelY+6)
		}
	}
	v.MinY -= laneTop
	v.H -= v.MinY
	return v
}

// answers draws the 2xx and the other answers per second, by answer time.
func (tl *timeline) answers(v *chartView) {
	ok, bad := make([]float64, tl.buckets), make([]float64, tl.buckets)
	for _, s := range tl.h.Sends {
		switch {
		case s.AnsweredAt == 0 || s.Status == 0:
		case is2xx(s.Status):
			ok[tl.bucket(s.AnsweredAt)]++
		default:
			bad[tl.bucket(s.AnsweredAt)]++
		}
	}
	per := float64(tl.step) / float64(time.Second)
	top := niceCeil(max(slices.Max(ok), slices.Max(bad)) / per)
	y := func(n float64) float64 { return ansBottom - n/per/top*(ansBottom-ansTop) }
	v.OK, v.Bad = tl.polyline(ok, y), tl.polyline(bad, y)
	for _, n := range []float64{0, top / 2, top} {
		v.AnsTicks = append(v.AnsTicks, tick{Y: y(n * per), Label: trimNum(n)})
	}
}

func (tl *timeline) polyline(ns []float64, y func(float64) float64) string {
	b := make([]byte, 0, len(ns)*16)
	for i, n := range ns {
		b = fmt.Appendf(b, "%.1f,%.1f ", tl.bucketX(i), y(n))
	}
	return string(b)
}

// latency draws p50 and p99 of the waits of the attempts sent in each
// bucket, on a log scale, and marks buckets holding attempts with no answer.
func (tl *timeline) latency(v *chartView) {
	waits := make([][]time.Duration, tl.buckets)
	none := make([]int, tl.buckets)
	top := time.Duration(tl.h.Meta.Bounds.AnswerMaxMS) * time.Millisecond
	for _, s := range tl.h.Sends {
		i := tl.bucket(s.SentAt)
		if s.AnsweredAt == 0 || s.Status == 0 {
			none[i]++
			continue
		}
		d := time.Duration(s.AnsweredAt - s.SentAt)
		waits[i] = append(waits[i], d)
		top = max(top, d)
	}
	lo, hi := -3.0, math.Ceil(math.Log10(max(top.Seconds(), 0.01)*1.2)) // 1 ms up to a decade above the worst
	y := func(d time.Duration) float64 {
		l := math.Log10(max(d.Seconds(), 1e-3))
		return latBottom - (l-lo)/(hi-lo)*(latBottom-latTop)
	}
	var p50, p99 []byte
	for i, ws := range waits {
		if len(ws) == 0 {
			continue
		}
		slices.Sort(ws)
		cmd := "L"
		if i == 0 || len(waits[i-1]) == 0 {
			cmd = "M"
		}
		p50 = fmt.Appendf(p50, "%s%.1f,%.1f ", cmd, tl.bucketX(i), y(rank(ws, 0.5)))
		p99 = fmt.Appendf(p99, "%s%.1f,%.1f ", cmd, tl.bucketX(i), y(rank(ws, 0.99)))
	}
	for i, n := range none {
		if n > 0 {
			v.NoAnswer = append(v.NoAnswer, dot{X: tl.bucketX(i),
				Title: fmt.Sprintf("%s: %d attempt(s) sent got no answer", tl.clock(tl.t0+int64(i)*tl.step), n)})
		}
	}
	v.P50, v.P99 = string(p50), string(p99)
	for e := lo; e <= hi; e++ {
		v.LatTicks = append(v.LatTicks, tick{Y: y(time.Duration(math.Pow(10, e) * float64(time.Second))), Label: decade(e)})
	}
	if b := tl.h.Meta.Bounds.AnswerMaxMS; b > 0 {
		v.BoundY = y(time.Duration(b) * time.Millisecond)
		v.BoundLabel = "bound " + fmtDur(time.Duration(b)*time.Millisecond)
	}
}

func decade(e float64) string {
	switch {
	case e < 0:
		return strconv.Itoa(int(math.Pow(10, e+3)+0.5)) + " ms"
	default:
		return strconv.Itoa(int(math.Pow(10, e)+0.5)) + " s"
	}
}

// xTicks are about eight round times since the start.
func (tl *timeline) xTicks() []tick {
	span := time.Duration(tl.t1 - tl.t0)
	every := time.Second
	for _, d := range []time.Duration{1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600} {
		every = d * time.Second
		if span/every <= 10 {
			break
		}
	}
	var out []tick
	for d := time.Duration(0); d <= span; d += every {
		out = append(out, tick{X: tl.x(tl.t0 + int64(d)), Y: axisY, Label: tl.clock(tl.t0 + int64(d))})
	}
	return out
}

// clock is t as minutes:seconds since the start.
func (tl *timeline) clock(t int64) string {
	s := (t - tl.t0) / int64(time.Second)
	return fmt.Sprintf("%d:%02d", s/60, s%60)
}

// bands shades each fault from start to end and labels it in the first
// lane above with room: its kind and target, or just its number.
func (tl *timeline) bands() []band {
	ls := newLanes(faultLanes)
	var out []band
	for i, f := range tl.h.Faults {
		end := f.End
		if end == 0 {
			end = tl.t1
		}
		x, x2 := tl.x(f.Start), tl.x(end)
		b := band{X: x, W: max(x2-x, 1.5), Color: faultColor(f.Kind),
			Title: fmt.Sprintf("#%d %s %s, %s to %s (%s) %s", i+1, f.Kind, f.Target, tl.clock(f.Start), tl.clock(end),
				fmtDur(time.Duration(end-f.Start)), f.Detail)}
		for _, label := range []string{fmt.Sprintf("#%d %s %s", i+1, f.Kind, f.Target), fmt.Sprintf("#%d", i+1)} {
			if lane, lx := ls.place(x, float64(len(label))*charW+4); lane >= 0 {
				b.Label, b.LabelX, b.LabelY = label, lx, laneTop+float64(faultLanes-lane)*laneH-3
				break
			}
		}
		out = append(out, b)
	}
	return out
}

// marks draws a line at each violation and labels it with its delivery id
// (cut to 14 characters; the whole id is in its title and the table).
func (tl *timeline) marks(vs []Violation) []mark {
	ls := newLanes(markLanes)
	labelled := map[string]float64{} // delivery id -> where it was last labelled
	var out []mark
	for _, v := range vs {
		m := mark{X: tl.x(v.At), Title: fmt.Sprintf("%s %s (%s) %s: %s", tl.clock(v.At), v.Kind, v.Rule, v.DeliveryID, v.Message)}
		label := v.DeliveryID
		if len(label) > 14 {
			label = label[:13] + "…"
		}
		if x, ok := labelled[v.DeliveryID]; ok && m.X-x < 40 {
			label = "" // a second rule about the same request: one label
		}
		if lane, lx := ls.place(m.X, float64(len([]rune(label)))*charW+14); label != "" && lane >= 0 {
			m.Label, m.LabelX, m.LabelY = label, lx, markTop+float64(lane+1)*laneH-3
			labelled[v.DeliveryID] = m.X
		}
		out = append(out, m)
	}
	return out
}

// lanes keeps labels from overlapping: each lane remembers where its last
// label ended.
type lanes struct{ ends []float64 }

func newLanes(n int) *lanes { return &lanes{ends: slices.Repeat([]float64{-1}, n)} }

// place returns the first lane where a label of width w fits at x, or -1,
// and where the label starts: at x, or further left at the chart's edge.
func (l *lanes) place(x, w float64) (int, float64) {
	x = min(x, chartW-w)
	for i, end := range l.ends {
		if x > end {
			l.ends[i] = x + w
			return i, x
		}
	}
	return -1, x
}

// faultColor gives each fault kind its hue.
func faultColor(kind string) string {
	switch kind {
	case history.FaultSigkill:
		return "#d62728"
	case history.FaultSigterm:
		return "#ff7f0e"
	case history.FaultSigstop:
		return "#9467bd"
	case history.FaultNetCut:
		return "#1f77b4"
	case history.FaultNetSlow:
		return "#17becf"
	case history.FaultNetDrop:
		return "#2ca02c"
	case history.FaultDiskFull:
		return "#8c564b"
	case history.FaultPowerCut:
		return "#e377c2"
	}
	return "#7f7f7f"
}

// niceCeil rounds n up to 1, 2 or 5 times a power of ten (at least 1).
func niceCeil(n float64) float64 {
	if n <= 1 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(n)))
	for _, m := range []float64{1, 2, 5, 10} {
		if n <= m*p {
			return m * p
		}
	}
	return 10 * p
}

func trimNum(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

// fmtDur prints a wait the way a person reads it: 12 ms, 1.3 s, 4m05s.
func fmtDur(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return fmt.Sprintf("%d µs", d.Microseconds())
	case d < time.Second:
		return fmt.Sprintf("%d ms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%.1f s", d.Seconds())
	}
	return d.Round(time.Second).String()
}
