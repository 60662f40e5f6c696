package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/calltap/calltap/relay"
	"github.com/calltap/calltap/relay/tunnel"
	"github.com/calltap/calltap/relay/wire"
	"github.com/calltap/calltap/storage/relaydb"
)

// The relay-scale part runs the relay in this process, so its goroutines
// can be counted, and holds the agents' websockets in a child process
// (`benchrun hold`), so each side has its own descriptor limit.

func cmdScale(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("scale", flag.ContinueOnError)
	out := fs.String("out", "", "results file")
	countsFlag := fs.String("counts", "1000,10000", "idle tunnels to hold, one measurement each")
	dialers := fs.Int("dialers", 64, "agents connecting at once (accept rate)")
	idle := fs.Duration("idle", 5*time.Second, "how long to watch the relay's CPU with every tunnel idle")
	if err := fs.Parse(args); err != nil {
		return err
	}
	counts, err := parseCounts(*countsFlag)
	if err != nil {
		return err
	}
	res, err := openResults(*out)
	if err != nil {
		return err
	}
	defer res.close()
	dir, err := os.MkdirTemp("", "calltap-bench-scale-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	db, err := relaydb.Open(ctx, filepath.Join(dir, "relay.db"))
	if err != nil {
		return err
	}
	defer db.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	relayURL := "http://" + ln.Addr().String()
	srv, err := relay.NewServer(ctx, relay.Config{Store: db, PublicURL: relayURL, Version: "bench",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	hs := srv.HTTPServer(ln.Addr().String())
	go srv.Run(runCtx)
	go hs.Serve(ln)
	defer hs.Close()

	tokFile := filepath.Join(dir, "tokens")
	if err := writeTokens(ctx, db, relayURL, tokFile, slices.Max(counts)); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	baseG := runtime.NumGoroutine()
	for _, n := range counts {
		if err := waitGoroutines(baseG, 20*time.Second); err != nil {
			return err
		}
		h := holdRun{self: self, relayURL: relayURL, tokFile: tokFile, n: n, dialers: *dialers, idle: *idle}
		if err := h.measure(ctx, res); err != nil {
			return err
		}
	}
	return nil
}

// parseCounts reads --counts, a comma-separated list of counts.
func parseCounts(list string) ([]int, error) {
	var counts []int
	for _, s := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("--counts: %q is not a count", s)
		}
		counts = append(counts, n)
	}
	return counts, nil
}

// writeTokens creates n tokens on the relay and writes them to file, one a
// line.
func writeTokens(ctx context.Context, db *relaydb.Store, relayURL, file string, n int) error {
	fmt.Fprintf(os.Stderr, "scale: creating %d tokens\n", n)
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	for i := range n {
		info, err := relay.CreateToken(ctx, db, fmt.Sprintf("agent-%d", i), relayURL)
		if err != nil {
			f.Close()
			return err
		}
		fmt.Fprintln(f, info.Token)
	}
	return f.Close()
}

// holdRun is one measure of cmdScale: n agents held by a child process.
type holdRun struct {
	self, relayURL, tokFile string
	n, dialers              int
	idle                    time.Duration
}

// measure connects the agents, measures the relay with them idle, and adds
// the rows.
func (h holdRun) measure(ctx context.Context, res *results) error {
	rss0 := liveRSS()
	g0 := runtime.NumGoroutine()
	fmt.Fprintf(os.Stderr, "scale: connecting %d agents\n", h.n)
	cmd := exec.CommandContext(ctx, h.self, "hold", "--relay", h.relayURL, "--tokens", h.tokFile, "--n", strconv.Itoa(h.n), "--dialers", strconv.Itoa(h.dialers))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	defer cmd.Wait()
	defer stdin.Close() // the holder exits, closing every websocket
	took := connectedAfter(stdout)
	if took == 0 {
		return fmt.Errorf("the agents did not all connect")
	}
	time.Sleep(2 * time.Second) // handshakes' garbage collected, timers settled
	rss1 := liveRSS()
	g1 := runtime.NumGoroutine()
	c0, _ := procCPU(os.Getpid())
	time.Sleep(h.idle)
	c1, _ := procCPU(os.Getpid())

	label := fmtCount(h.n)
	perTunnel := float64(rss1-rss0) / float64(h.n)
	r := row{Measure: fmt.Sprintf("Relay with %s idle tunnels: RSS per tunnel (total %s)", label, fmtBytes(float64(rss1))),
		Calltap: fmtBytes(perTunnel)}
	if h.n >= 10000 {
		r.Target, r.Met = "≤ 64 KiB", verdict(perTunnel <= 64<<10)
	}
	res.add(r)
	res.add(row{Measure: fmt.Sprintf("Relay with %s idle tunnels: goroutines per tunnel", label),
		Calltap: fmt.Sprintf("%.2f", float64(g1-g0)/float64(h.n))})
	res.add(row{Measure: fmt.Sprintf("Relay with %s idle tunnels: CPU while idle", label),
		Calltap: fmt.Sprintf("%.1f%% of a core", 100*(c1-c0).Seconds()/h.idle.Seconds())})
	res.add(row{Measure: fmt.Sprintf("Relay accept rate: %s agents connecting, %d at a time (handshake, token check, hello)", label, h.dialers),
		Calltap: fmtRate(float64(h.n)/took.Seconds(), "/s")})
	return nil
}

// connectedAfter reads the holder's "connected <duration>" line; 0 if it
// ended without one.
func connectedAfter(stdout io.Reader) time.Duration {
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "connected "); ok {
			took, _ := time.ParseDuration(v)
			return took
		}
	}
	return 0
}

// liveRSS is this process's resident memory after a full collection has
// returned free pages to the system: what the live state costs.
func liveRSS() int64 {
	runtime.GC()
	debug.FreeOSMemory()
	n, _ := procStatus(0, "VmRSS")
	return n
}

// waitGoroutines waits until no more than a few goroutines beyond want run.
func waitGoroutines(want int, within time.Duration) error {
	err := poll(context.Background(), within, 50*time.Millisecond, "goroutines", func() bool { return runtime.NumGoroutine() <= want+8 })
	if err != nil {
		return fmt.Errorf("the relay still runs %d goroutines after its agents left (%d before)", runtime.NumGoroutine(), want)
	}
	return nil
}

// idleHandler drops whatever reaches it; the held tunnels get no traffic.
type idleHandler struct{}

func (idleHandler) ServeTunnel(r *wire.Request, s *tunnel.Stream) { s.Release() }

// cmdHold connects n agents with tunnel.Client, at most dialers at a time,
// prints "connected <duration>" once every one has its hello, and holds
// them until stdin closes.
func cmdHold(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("hold", flag.ContinueOnError)
	relayURL := fs.String("relay", "", "relay URL")
	tokFile := fs.String("tokens", "", "file of tokens, one a line")
	n := fs.Int("n", 0, "agents")
	dialers := fs.Int("dialers", 64, "agents connecting at once")
	if err := fs.Parse(args); err != nil {
		return err
	}
	b, err := os.ReadFile(*tokFile)
	if err != nil {
		return err
	}
	tokens := strings.Fields(string(b))
	if len(tokens) < *n {
		return fmt.Errorf("%d tokens for %d agents", len(tokens), *n)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { // the parent closes stdin to stop us
		io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	sem := make(chan struct{}, *dialers)
	var connected atomic.Int64
	all := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	for i := range *n {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		var once sync.Once
		c, err := tunnel.NewClient(tunnel.Config{RelayURL: *relayURL, Token: tokens[i], Handler: idleHandler{}, Logger: quiet,
			OnState: func(cs tunnel.ConnState) {
				if cs.State == tunnel.StateConnected {
					once.Do(func() {
						<-sem
						if connected.Add(1) == int64(*n) {
							close(all)
						}
					})
				}
			}})
		if err != nil {
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
				fmt.Fprintf(os.Stderr, "hold: agent %d: %v\n", i, err)
			}
		}()
	}
	select {
	case <-all:
		fmt.Printf("connected %s\n", time.Since(start))
	case <-ctx.Done():
	case <-time.After(5 * time.Minute):
		return fmt.Errorf("only %d of %d agents connected", connected.Load(), *n)
	}
	<-ctx.Done()
	wg.Wait()
	return nil
}
