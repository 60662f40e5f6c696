package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// proxies are the network links the nemesis can cut, slow or break:
// Shopify's toxiproxy, embedded, one proxy per link ("agent->relay-1",
// "relay-0->nats-2"), each listening on 127.0.0.1.
type proxies struct {
	server *toxiproxy.ApiServer

	mu  sync.Mutex
	all map[string]*toxiproxy.Proxy // guarded by mu; by link name
}

func newProxies() *proxies {
	m := toxiproxy.NewMetricsContainer(prometheus.NewRegistry())
	return &proxies{server: toxiproxy.NewServer(m, zerolog.Nop()), all: map[string]*toxiproxy.Proxy{}}
}

// add starts the proxy of link on port, in front of upstream.
func (ps *proxies) add(link string, port int, upstream string) (addr string, err error) {
	p := toxiproxy.NewProxy(ps.server, link, fmt.Sprintf("127.0.0.1:%d", port), upstream)
	if err := p.Start(); err != nil {
		return "", fmt.Errorf("proxy %s: %w", link, err)
	}
	ps.mu.Lock()
	ps.all[link] = p
	ps.mu.Unlock()
	return p.Listen, nil
}

// matching are the proxies whose link name starts with prefix, e.g.
// "relay-1->nats" for a node's links to every NATS server.
func (ps *proxies) matching(prefix string) []*toxiproxy.Proxy {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	var out []*toxiproxy.Proxy
	for name, p := range ps.all {
		if strings.HasPrefix(name, prefix) {
			out = append(out, p)
		}
	}
	return out
}

// toxic adds the toxic described by js (toxiproxy's JSON form) to every
// proxy of prefix.
func (ps *proxies) toxic(prefix, js string) error {
	for _, p := range ps.matching(prefix) {
		if _, err := p.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
			return fmt.Errorf("toxic on %s: %w", p.Name, err)
		}
	}
	return nil
}

// disable closes the proxies of prefix: open connections are cut and new
// ones refused, as a firewall that rejects.
func (ps *proxies) disable(prefix string) {
	for _, p := range ps.matching(prefix) {
		p.Stop()
	}
}

// heal removes every toxic of the proxies of prefix and opens them again.
// With reset, their connections are closed first: a link that dropped bytes
// silently (a black hole) must not carry on with a stream missing them, so
// it ends as a connection a long partition would have timed out.
func (ps *proxies) heal(prefix string, reset bool) error {
	for _, p := range ps.matching(prefix) {
		p.Toxics.ResetToxics(context.Background())
		if reset {
			p.Stop()
		}
		if err := p.Start(); err != nil && !errors.Is(err, toxiproxy.ErrProxyAlreadyStarted) {
			return fmt.Errorf("proxy %s: %w", p.Name, err)
		}
	}
	return nil
}

// close stops every proxy.
func (ps *proxies) close() {
	for _, p := range ps.matching("") {
		p.Stop()
	}
}
