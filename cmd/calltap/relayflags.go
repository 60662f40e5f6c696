package main

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"strconv"
	"strings"
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
	claims         *claimFlags // calltap relay's; nil for dev, whose relay takes the defaults
}

// claimFlags bound what the agents of a shared token keep on the relay
// (calltap help team).
type claimFlags struct {
	maxClaims  int
	claimTTL   time.Duration
	callMemory time.Duration
}

func (f *claimFlags) register(fs *flagSet, d relay.Config) {
	f.claimTTL, f.callMemory = d.ClaimTTL, d.CallMemory
	fs.IntVar(&f.maxClaims, "max-claims", d.MaxClaims, "most claims per token, every agent's counted (an agent taking a token past it is refused)")
	fs.Var((*days)(&f.claimTTL), "claim-ttl", "a claimant's seat, and the requests queued for it, are released once its agent has been away this long (`duration`: 7d, 36h)")
	fs.Var((*days)(&f.callMemory), "call-memory", "a call stays with the agent of its first event until this long after its last event (`duration`: 24h, 2d)")
}

func (f *claimFlags) validate() error {
	if f.maxClaims < 1 {
		return errors.New("--max-claims must be 1 or more")
	}
	return nil
}

// days is a duration flag that takes whole or fractional days too (7d,
// 1.5d) besides Go's durations (36h): a claim's TTL is counted in days.
// It takes only durations above zero.
type days time.Duration

// String says whole days as days past one (7d), whole hours as hours
// (24h, 36h).
func (d *days) String() string {
	switch v := time.Duration(*d); {
	case v > 24*time.Hour && v%(24*time.Hour) == 0:
		return strconv.FormatInt(int64(v/(24*time.Hour)), 10) + "d"
	case v > 0 && v%time.Hour == 0:
		return strconv.FormatInt(int64(v/time.Hour), 10) + "h"
	}
	return time.Duration(*d).String()
}

func (d *days) Set(s string) error {
	v, err := time.ParseDuration(s)
	if n, ok := strings.CutSuffix(s, "d"); ok {
		var f float64
		f, err = strconv.ParseFloat(n, 64)
		v = time.Duration(f * float64(24*time.Hour))
		if err != nil || math.IsNaN(f) || f > 1e5 {
			err = errors.New("want a number of days (7d) or a duration (36h)")
		}
	}
	if err != nil {
		return err
	}
	if v <= 0 {
		return errors.New("want a duration above zero")
	}
	*d = days(v)
	return nil
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
	if !dev {
		f.claims = &claimFlags{}
		f.claims.register(fs, d)
	}
}

func (f *relayFlags) config(db relay.Store, publicURL string) relay.Config {
	cfg := relay.Config{
		Store: db, PublicURL: publicURL, Version: version,
		ForwardTimeout: f.forwardTimeout, MaxBody: f.maxBody, MaxHeaderBytes: f.maxHeaderBytes,
		Offline: f.offline, QueueMaxCount: f.queueMaxCount, QueueMaxBytes: f.queueMaxBytes, QueueMaxAge: f.queueMaxAge,
		RateLimit: f.rateLimit, RateBurst: f.rateBurst, NoRateLimit: f.rateLimit == 0, MaxInFlight: f.maxInFlight, AuthTimeout: f.authTimeout,
		Keepalive: frameconn.Keepalive{PongWait: f.pongWait},
	}
	if c := f.claims; c != nil {
		cfg.MaxClaims, cfg.ClaimTTL, cfg.CallMemory = c.maxClaims, c.claimTTL, c.callMemory
	}
	return cfg
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
	if f.claims != nil {
		return f.claims.validate()
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
