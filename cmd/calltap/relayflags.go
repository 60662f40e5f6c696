package main

import (
	"flag"
	"fmt"
	"math"
	"time"

	"github.com/calltap/calltap/relay"
	"github.com/calltap/calltap/relay/frameconn"
)

// The relay's flags, which calltap relay and calltap dev (a relay of its
// own) share.

// relayFlags are the public server's settings, shared by relay and dev.
type relayFlags struct {
	forwardTimeout time.Duration
	maxBody        int64
	maxHeaderBytes int
	offline        string
	queueMaxCount  int
	queueMaxBytes  int64
	queueMaxAge    time.Duration
	rateLimit      float64
	rateBurst      int
	maxInFlight    int
	authTimeout    time.Duration
	pongWait       time.Duration
	stopGrace      time.Duration
}

// register adds the flags; dev has no rate limit unless asked, since
// everything it serves is on loopback.
func (f *relayFlags) register(fs *flagSet, dev bool) {
	d := relay.DefaultConfig()
	rateLimit := d.RateLimit
	if dev {
		rateLimit = 0
	}
	fs.DurationVar(&f.forwardTimeout, "forward-timeout", d.ForwardTimeout, "how long a sender waits for the local handler before 504")
	fs.Int64Var(&f.maxBody, "max-body", d.MaxBody, "largest body in bytes: a larger request → 413, a larger answer of the local handler → 502")
	fs.IntVar(&f.maxHeaderBytes, "max-header-bytes", d.MaxHeaderBytes, "largest request head in bytes (larger → 431)")
	fs.StringVar(&f.offline, "offline", d.Offline, "`mode` while a tunnel has no agent: queue (store, answer 202) or reject (503 + Retry-After)")
	fs.IntVar(&f.queueMaxCount, "queue-max-count", d.QueueMaxCount, "most requests held per offline tunnel (more → 503)")
	fs.Int64Var(&f.queueMaxBytes, "queue-max-bytes", d.QueueMaxBytes, "most bytes held per offline tunnel (more → 503)")
	fs.DurationVar(&f.queueMaxAge, "queue-max-age", d.QueueMaxAge, "queued requests older than this are dropped")
	fs.Float64Var(&f.rateLimit, "rate-limit", rateLimit, "requests per second per tunnel (more → 429); 0: no limit")
	fs.IntVar(&f.rateBurst, "rate-burst", d.RateBurst, "burst allowed above --rate-limit")
	fs.IntVar(&f.maxInFlight, "max-in-flight", d.MaxInFlight, "concurrent requests per tunnel (more → 503)")
	fs.DurationVar(&f.authTimeout, "auth-timeout", d.AuthTimeout, "time a client has to send its request head (agents: to authenticate)")
	fs.DurationVar(&f.pongWait, "pong-wait", d.Keepalive.PongWait, "an agent silent this long is considered gone")
	fs.DurationVar(&f.stopGrace, "stop-grace", defaultStopGrace, "on SIGTERM, how long requests in flight may take to be answered; those still waiting then get 503 + Retry-After")
}

func (f *relayFlags) config(db relay.Store, publicURL string) relay.Config {
	return relay.Config{
		Store: db, PublicURL: publicURL, Version: version,
		ForwardTimeout: f.forwardTimeout, MaxBody: f.maxBody, MaxHeaderBytes: f.maxHeaderBytes,
		Offline: f.offline, QueueMaxCount: f.queueMaxCount, QueueMaxBytes: f.queueMaxBytes, QueueMaxAge: f.queueMaxAge,
		RateLimit: f.rateLimit, RateBurst: f.rateBurst, NoRateLimit: f.rateLimit == 0, MaxInFlight: f.maxInFlight, AuthTimeout: f.authTimeout,
		Keepalive: frameconn.Keepalive{PongWait: f.pongWait},
	}
}

func (f *relayFlags) validate() error {
	if f.offline != relay.OfflineQueue && f.offline != relay.OfflineReject {
		return fmt.Errorf("--offline must be %q or %q", relay.OfflineQueue, relay.OfflineReject)
	}
	if !(f.rateLimit >= 0) || math.IsInf(f.rateLimit, 0) {
		return fmt.Errorf("--rate-limit must be a number of requests per second, or 0 for no limit; got %v", f.rateLimit)
	}
	if f.rateBurst < 1 {
		return fmt.Errorf("--rate-burst must be 1 or more")
	}
	return nil
}

// flagGiven reports whether name was set on the command line.
func flagGiven(fs *flagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}

// defaultStopGrace is a relay's --stop-grace: within the 30 s a service
// manager usually waits after SIGTERM before it kills.
const defaultStopGrace = 20 * time.Second
