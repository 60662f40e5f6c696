// Package load is make bench's load generator, deliberately thin, like wrk:
// each worker owns one keep-alive TCP connection, writes a prepared
// request and parses just enough of the response (status line,
// Content-Length, chunked) to find its end. No net/http client, so its own
// hand-offs and allocations are not charged to the setup under test.
package load

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Spec is one run: fixed concurrency for a fixed time after a warmup.
type Spec struct {
	Addr        string // host:port, loopback
	Path        string // request target
	Body        []byte
	ContentType string
	Stamp       int // >0: offset in Body of 12 hex digits made unique per request: the load's number, the connection's, a count
	Conns       int
	Warmup      time.Duration
	Duration    time.Duration
	OnStart     func() // called as the measured window opens
	OnEnd       func() // called as it closes
}

// Result is what happened inside the measured window.
type Result struct {
	N        int             // responses completed inside the window
	Elapsed  time.Duration   // the window
	Lat      []time.Duration // latencies of those responses, sorted
	Statuses map[int]int     // by status code
	Errors   int             // transport errors (the worker reconnects)
}

func (r *Result) Rate() float64 { return float64(r.N) / r.Elapsed.Seconds() }

// Pct is the p-th percentile (0..100) of the latencies.
func (r *Result) Pct(p float64) time.Duration {
	if len(r.Lat) == 0 {
		return 0
	}
	i := int(float64(len(r.Lat)-1) * p / 100)
	return r.Lat[i]
}

// Merge folds another run of the same setup in (rounds of a side-by-side).
func (r *Result) Merge(o Result) {
	r.N += o.N
	r.Elapsed += o.Elapsed
	r.Lat = append(r.Lat, o.Lat...)
	slices.Sort(r.Lat)
	if r.Statuses == nil {
		r.Statuses = map[int]int{}
	}
	for k, v := range o.Statuses {
		r.Statuses[k] += v
	}
	r.Errors += o.Errors
}

// Non2xx counts responses that were not 2xx.
func (r *Result) Non2xx() int {
	n := 0
	for code, c := range r.Statuses {
		if code < 200 || code > 299 {
			n += c
		}
	}
	return n
}

func buildRequest(s Spec, host string) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "POST %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: calltap-bench\r\n", s.Path, host)
	if s.ContentType != "" {
		fmt.Fprintf(&b, "Content-Type: %s\r\n", s.ContentType)
	}
	fmt.Fprintf(&b, "Content-Length: %d\r\n\r\n", len(s.Body))
	b.Write(s.Body)
	return b.Bytes()
}

// sample is one completed request: when it started and ended, in
// nanoseconds since the run began.
type sample struct {
	start, end int64
	status     int
}

// loadRuns numbers the loads of this process, so that no two stamp the
// same value: an agent that got a delivery id before takes the request for
// a redelivery (a duplicate), which costs it a look-up a new one does not.
var loadRuns atomic.Uint64

// Run runs s: its connections open, its warm-up, then its measured window.
func Run(ctx context.Context, s Spec) (Result, error) {
	l := &loadRun{s: s, run: loadRuns.Add(1) & 0xff, req: buildRequest(s, s.Addr), base: time.Now(), per: make([][]sample, s.Conns)}
	var wg sync.WaitGroup
	for i := range s.Conns {
		wg.Add(1)
		l.ready.Add(1)
		go func() {
			defer wg.Done()
			l.per[i] = l.conn(i)
		}()
	}
	l.ready.Wait() // connections open before the clock starts
	Sleep(ctx, s.Warmup)
	t0 := time.Since(l.base)
	if s.OnStart != nil {
		s.OnStart()
	}
	Sleep(ctx, s.Duration)
	t1 := time.Since(l.base)
	if s.OnEnd != nil {
		s.OnEnd()
	}
	l.stop.Store(true)
	wg.Wait()
	res := l.result(t0, t1)
	if err := ctx.Err(); err != nil {
		return res, err
	}
	if res.N == 0 {
		err, _ := l.firstErr.Load().(error)
		return res, fmt.Errorf("no request completed against %s: %v", s.Addr, err)
	}
	return res, nil
}

// loadRun is one Run: its connections' shared state.
type loadRun struct {
	s        Spec
	run      uint64
	req      []byte // the request every connection sends, before its stamp
	base     time.Time
	per      [][]sample // each connection's, written by it before wg.Done
	stop     atomic.Bool
	errs     atomic.Int64
	firstErr atomic.Value
	ready    sync.WaitGroup // each connection's first dial
}

// conn runs connection i until stop: a request at a time, each stamped
// with a value of its own, timed from its write to its answer's end.
func (l *loadRun) conn(i int) []sample {
	samples := make([]sample, 0, 1<<14)
	req := l.req
	var seq uint64
	stampAt := -1
	if l.s.Stamp > 0 {
		req = bytes.Clone(req)
		stampAt = len(req) - len(l.s.Body) + l.s.Stamp
	}
	var conn net.Conn
	var br *bufio.Reader
	readyOnce := sync.OnceFunc(l.ready.Done)
	defer readyOnce()
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	for !l.stop.Load() {
		if conn == nil {
			if conn, br = l.dial(); conn == nil {
				continue
			}
			readyOnce()
		}
		if stampAt >= 0 {
			seq++
			StampHex(req, stampAt, l.run<<40|uint64(i)<<32|seq)
		}
		x, closeAfter, err := l.send(conn, br, req)
		if err != nil || closeAfter {
			conn.Close()
			conn = nil
		}
		if err == nil {
			samples = append(samples, x)
		}
	}
	return samples
}

// dial opens a connection, or notes the error and pauses.
func (l *loadRun) dial() (net.Conn, *bufio.Reader) {
	c, err := net.DialTimeout("tcp", l.s.Addr, 5*time.Second)
	if err != nil {
		l.firstErr.CompareAndSwap(nil, err)
		l.errs.Add(1)
		time.Sleep(10 * time.Millisecond)
		return nil, nil
	}
	return c, bufio.NewReaderSize(c, 64<<10)
}

// send sends req on conn and reads the answer; an error (not counted once
// the run stops) leaves the connection to be closed.
func (l *loadRun) send(conn net.Conn, br *bufio.Reader, req []byte) (sample, bool, error) {
	start := time.Since(l.base)
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	_, err := conn.Write(req)
	var status int
	var closeAfter bool
	if err == nil {
		status, closeAfter, err = readResponse(br)
	}
	end := time.Since(l.base)
	if err != nil && !l.stop.Load() {
		l.firstErr.CompareAndSwap(nil, err)
		l.errs.Add(1)
	}
	return sample{int64(start), int64(end), status}, closeAfter, err
}

// result counts the requests that started and ended in the measured
// window, t0 to t1.
func (l *loadRun) result(t0, t1 time.Duration) Result {
	res := Result{Elapsed: t1 - t0, Statuses: map[int]int{}, Errors: int(l.errs.Load())}
	for _, samples := range l.per {
		for _, x := range samples {
			if x.start >= int64(t0) && x.end <= int64(t1) {
				res.N++
				res.Lat = append(res.Lat, time.Duration(x.end-x.start))
				res.Statuses[x.status]++
			}
		}
	}
	slices.Sort(res.Lat)
	return res
}

// Sleep waits d, or until ctx ends.
func Sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

var errBadResponse = errors.New("malformed HTTP response")

// readResponse reads one response and discards its body.
func readResponse(br *bufio.Reader) (status int, closeAfter bool, err error) {
	line, err := br.ReadSlice('\n')
	if err != nil {
		return 0, false, err
	}
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) {
		return 0, false, errBadResponse
	}
	status, err = strconv.Atoi(string(line[9:12]))
	if err != nil {
		return 0, false, errBadResponse
	}
	h, err := readHeaders(br)
	if err != nil {
		return 0, false, err
	}
	switch {
	case h.chunked:
		err = discardChunks(br)
	case h.length >= 0:
		_, err = br.Discard(int(h.length))
	default:
		io.Copy(io.Discard, br)
		h.closeAfter = true
	}
	if err != nil {
		return 0, false, err
	}
	return status, h.closeAfter, nil
}

// responseHeaders is what readResponse needs of a response's headers.
type responseHeaders struct {
	length              int64 // -1: none given
	chunked, closeAfter bool
}

func readHeaders(br *bufio.Reader) (responseHeaders, error) {
	h := responseHeaders{length: -1}
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return h, err
		}
		if len(line) <= 2 {
			return h, nil
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			return h, errBadResponse
		}
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			if h.length, err = strconv.ParseInt(string(value), 10, 64); err != nil {
				return h, errBadResponse
			}
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			h.chunked = bytes.Contains(bytes.ToLower(value), []byte("chunked"))
		case bytes.EqualFold(name, []byte("Connection")):
			h.closeAfter = bytes.EqualFold(value, []byte("close"))
		}
	}
}

// discardChunks reads a chunked body to its end.
func discardChunks(br *bufio.Reader) error {
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return err
		}
		sz, _, _ := bytes.Cut(bytes.TrimSpace(line), []byte(";"))
		n, err := strconv.ParseInt(string(sz), 16, 64)
		if err != nil {
			return errBadResponse
		}
		if _, err := br.Discard(int(n) + 2); err != nil { // data and its CRLF
			return err
		}
		if n == 0 { // no trailers from our servers
			return nil
		}
	}
}

const hexDigits = "0123456789abcdef"

// StampHex writes v as 12 hex digits at b[off:].
func StampHex(b []byte, off int, v uint64) {
	for i := 11; i >= 0; i-- {
		b[off+i] = hexDigits[v&0xf]
		v >>= 4
	}
}
