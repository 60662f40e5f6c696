package main

import (
	"context"
	"flag"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/calltap/calltap/scripts/benchrun/load"
)

// cmdQueue measures the offline queue with real processes: senders post
// to a tunnel whose agent is away (the relay stores each request and
// answers 202), then the agent starts and the queue drains.
func cmdQueue(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("queue", flag.ContinueOnError)
	bin := fs.String("bin", "bin/calltap", "the calltap binary")
	out := fs.String("out", "", "results file")
	dur := fs.Duration("duration", 3*time.Second, "how long senders post while the agent is away")
	conns := fs.Int("c", 32, "concurrent senders")
	if err := fs.Parse(args); err != nil {
		return err
	}
	pt, err := openPart(*out, "", "queue")
	if err != nil {
		return err
	}
	defer pt.close()
	if err := pt.withRelay(ctx, *bin, append(relayFlagsNoLimits, "--queue-max-count", "1000000", "--queue-max-bytes", "4000000000")...); err != nil {
		return err
	}
	res, ct := pt.res, pt.ct
	ev, stamp := jsonEvent2K()
	u, _ := url.Parse(ct.relayURL)
	var c0, c1 time.Duration
	r, err := load.Run(ctx, load.Spec{Addr: u.Host, Path: ct.tunnelPath + "/voice", Body: ev, Stamp: stamp, ContentType: "application/json",
		Conns: *conns, Warmup: 500 * time.Millisecond, Duration: *dur,
		OnStart: func() { c0, _ = procCPU(ct.relay.pid()) },
		OnEnd:   func() { c1, _ = procCPU(ct.relay.pid()) }})
	if err != nil {
		return err
	}
	enq := row{Measure: fmt.Sprintf("Offline queue: enqueue rate, no agent (2 KB events, c=%d; relay stores each, answers 202)", *conns),
		Calltap: fmtRate(r.Rate(), "/s") + fmt.Sprintf(", p50 %s, p99 %s, relay CPU %s/request", fmtDur(r.Pct(50)), fmtDur(r.Pct(99)), fmtDur((c1-c0)/time.Duration(max(r.N, 1))))}
	if r.Statuses[202] != r.N {
		enq.Calltap += fmt.Sprintf(" (%d not 202)", r.N-r.Statuses[202])
	}
	res.add(enq)

	return measureQueueDrain(ctx, pt)
}

// measureQueueDrain starts the agent of a relay holding requests and times
// until they are saved by it and removed from the relay, and until the
// handler has them all.
func measureQueueDrain(ctx context.Context, pt *part) error {
	ct := pt.ct
	depth, err := ct.relayMetric("calltap_queue_depth")
	if err != nil {
		return err
	}
	before, err := handlerCount(pt.hurl)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "queue: %d requests held; starting the agent\n", int(depth))
	t0 := time.Now()
	if err := ct.startAgent(ctx, false); err != nil {
		return err
	}
	var tConnected, tAcked, tDelivered time.Duration
	err = poll(ctx, 10*time.Minute, 5*time.Millisecond, "the queue did not drain", func() bool {
		if tConnected == 0 {
			if v, err := ct.relayMetric("calltap_tunnels_connected"); err == nil && v > 0 {
				tConnected = time.Since(t0)
			}
			return false
		}
		if tAcked == 0 {
			if v, err := ct.relayMetric("calltap_queue_depth"); err == nil && v == 0 {
				tAcked = time.Since(t0)
			}
		}
		if n, err := handlerCount(pt.hurl); err == nil && float64(n-before) >= depth {
			tDelivered = time.Since(t0)
		}
		return tAcked > 0 && tDelivered > 0
	})
	if err != nil {
		return err
	}
	held := fmtCount(int(depth))
	pt.res.add(row{Measure: fmt.Sprintf("Offline queue: drain on reconnect, %s held → saved by the agent and removed from the relay", held),
		Calltap: fmtRate(depth/(tAcked-tConnected).Seconds(), "/s") + " (" + fmtDur(tAcked-tConnected) + " after connecting)"})
	pt.res.add(row{Measure: fmt.Sprintf("Offline queue: drain on reconnect, %s held → delivered to the handler, in order", held),
		Calltap: fmtRate(depth/(tDelivered-tConnected).Seconds(), "/s") + " (" + fmtDur(tDelivered-tConnected) + ")"})
	return nil
}

func handlerCount(hurl string) (int, error) {
	b, err := getBody(hurl + "/_count")
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}
