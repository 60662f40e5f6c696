package relay_test

import (
	"io"
	"net"
	"sync"
	"testing"
)

// cutProxy carries TCP connections to a relay, and can cut them on the
// agent's side only: the relay keeps the stale ones until it finds out.
type cutProxy struct {
	ln       net.Listener
	upstream string

	mu    sync.Mutex
	conns []net.Conn // guarded by mu; the agent's side of each connection
	stale []net.Conn // guarded by mu; the relay's side of cut ones, closed at the end
}

func startCutProxy(t *testing.T, upstream string) *cutProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, upstream: upstream}
	go p.serve()
	t.Cleanup(p.close)
	return p
}

func (p *cutProxy) addr() string { return p.ln.Addr().String() }

func (p *cutProxy) serve() {
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.upstream)
		if err != nil {
			down.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, down)
		p.stale = append(p.stale, up)
		p.mu.Unlock()
		go io.Copy(up, down) //nolint:errcheck // ends with either side
		go io.Copy(down, up) //nolint:errcheck
	}
}

// cut closes the agent's side of every connection so far.
func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

func (p *cutProxy) close() {
	p.ln.Close()
	p.cut()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.stale {
		c.Close()
	}
}
