package main

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

// The load generator is deliberately thin, like wrk: each worker owns one
// keep-alive TCP connection, writes a prepared request and parses just
// enough of the response (status line, Content-Length, chunked) to find its
// end. No net/http client, so its own hand-offs and allocations are not
// charged to the setup under test.

// loadSpec is one run: fixed concurrency for a fixed time after a warmup.
type loadSpec struct {
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

// loadResult is what happened inside the measured window.
type loadResult struct {
	N        int             // responses completed inside the window
	Elapsed  time.Duration   // the window
	Lat      []time.Duration // latencies of those responses, sorted
	Statuses map[int]int     // by status code
	Errors   int             // transport errors (the worker reconnects)
}

func (r *loadResult) rate() float64 { return float64(r.N) / r.Elapsed.Seconds() }

// pct is the p-th percentile (0..100) of the latencies.
func (r *loadResult) pct(p float64) time.Duration {
	if len(r.Lat) == 0 {
		return 0
	}
	i := int(float64(len(r.Lat)-1) * p / 100)
	return r.Lat[i]
}

// merge folds another run of the same setup in (rounds of a side-by-side).
func (r *loadResult) merge(o loadResult) {
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

// non2xx counts responses that were not 2xx.
func (r *loadResult) non2xx() int {
	n := 0
	for code, c := range r.Statuses {
		if code < 200 || code > 299 {
			n += c
		}
	}
	return n
}

func buildRequest(s loadSpec, host string) []byte {
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

func runLoad(ctx context.Context, s loadSpec) (loadResult, error) {
	run := loadRuns.Add(1) & 0xff
	req := buildRequest(s, s.Addr)
	base := time.Now()
	var stop atomic.Bool
	var errs atomic.Int64
	per := make([][]sample, s.Conns)
	var wg sync.WaitGroup
	var ready sync.WaitGroup
	var firstErr atomic.Value
	for i := range s.Conns {
		wg.Add(1)
		ready.Add(1)
		go func() {
			defer wg.Done()
			samples := make([]sample, 0, 1<<14)
			req := req
			var seq uint64
			stampAt := -1
			if s.Stamp > 0 {
				req = bytes.Clone(req)
				stampAt = len(req) - len(s.Body) + s.Stamp
			}
			var conn net.Conn
			var br *bufio.Reader
			readyOnce := sync.OnceFunc(ready.Done)
			defer readyOnce()
			for !stop.Load() {
				if conn == nil {
					c, err := net.DialTimeout("tcp", s.Addr, 5*time.Second)
					if err != nil {
						firstErr.CompareAndSwap(nil, err)
						errs.Add(1)
						time.Sleep(10 * time.Millisecond)
						continue
					}
					conn, br = c, bufio.NewReaderSize(c, 64<<10)
					readyOnce()
				}
				if stampAt >= 0 {
					seq++
					stampHex(req, stampAt, run<<40|uint64(i)<<32|seq)
				}
				start := time.Since(base)
				conn.SetDeadline(time.Now().Add(30 * time.Second))
				_, err := conn.Write(req)
				var status int
				var closeAfter bool
				if err == nil {
					status, closeAfter, err = readResponse(br)
				}
				end := time.Since(base)
				if err != nil {
					if !stop.Load() {
						firstErr.CompareAndSwap(nil, err)
						errs.Add(1)
					}
					conn.Close()
					conn = nil
					continue
				}
				samples = append(samples, sample{int64(start), int64(end), status})
				if closeAfter {
					conn.Close()
					conn = nil
				}
			}
			if conn != nil {
				conn.Close()
			}
			per[i] = samples
		}()
	}
	ready.Wait() // connections open before the clock starts
	sleep(ctx, s.Warmup)
	t0 := time.Since(base)
	if s.OnStart != nil {
		s.OnStart()
	}
	sleep(ctx, s.Duration)
	t1 := time.Since(base)
	if s.OnEnd != nil {
		s.OnEnd()
	}
	stop.Store(true)
	wg.Wait()
	res := loadResult{Elapsed: t1 - t0, Statuses: map[int]int{}, Errors: int(errs.Load())}
	for _, samples := range per {
		for _, x := range samples {
			if x.start >= int64(t0) && x.end <= int64(t1) {
				res.N++
				res.Lat = append(res.Lat, time.Duration(x.end-x.start))
				res.Statuses[x.status]++
			}
		}
	}
	slices.Sort(res.Lat)
	if err := ctx.Err(); err != nil {
		return res, err
	}
	if res.N == 0 {
		err, _ := firstErr.Load().(error)
		return res, fmt.Errorf("no request completed against %s: %v", s.Addr, err)
	}
	return res, nil
}

func sleep(ctx context.Context, d time.Duration) {
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
	length := int64(-1)
	chunked := false
	for {
		line, err = br.ReadSlice('\n')
		if err != nil {
			return 0, false, err
		}
		if len(line) <= 2 {
			break
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			return 0, false, errBadResponse
		}
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			length, err = strconv.ParseInt(string(value), 10, 64)
			if err != nil {
				return 0, false, errBadResponse
			}
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			chunked = bytes.Contains(bytes.ToLower(value), []byte("chunked"))
		case bytes.EqualFold(name, []byte("Connection")):
			closeAfter = bytes.EqualFold(value, []byte("close"))
		}
	}
	switch {
	case chunked:
		for {
			line, err := br.ReadSlice('\n')
			if err != nil {
				return 0, false, err
			}
			sz, _, _ := bytes.Cut(bytes.TrimSpace(line), []byte(";"))
			n, err := strconv.ParseInt(string(sz), 16, 64)
			if err != nil {
				return 0, false, errBadResponse
			}
			if _, err := br.Discard(int(n) + 2); err != nil { // data and its CRLF
				return 0, false, err
			}
			if n == 0 { // no trailers from our servers
				break
			}
		}
	case length >= 0:
		if _, err := br.Discard(int(length)); err != nil {
			return 0, false, err
		}
	default:
		io.Copy(io.Discard, br)
		closeAfter = true
	}
	return status, closeAfter, nil
}
