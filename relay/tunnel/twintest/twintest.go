// Package twintest races, for tests, two agents that use one token: both
// start at one instant, and the relay is to keep exactly one of them, the
// one started later, while the other exits. It holds the clients and the
// handler that names which agent answered, so that the single-relay and
// team-relay tests race them alike.
package twintest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/calltap/calltap/relay/tunnel"
	"github.com/calltap/calltap/relay/wire"
)

// Status is what an agent's handler answers with; its body is the agent's
// name.
const Status = 299

// named answers every request itself, with its agent's name.
type named string

func (n named) ServeTunnel(r *wire.Request, s *tunnel.Stream) {
	s.Ack()
	s.Respond(&wire.Response{Status: Status, Body: []byte(n)})
	s.Release()
}

// Race starts agents "a" and "b" with token, a connecting to relayURLs[0]
// and b to relayURLs[1], released by one channel close, and waits for one
// of them to exit. It fails t unless that one ended with ErrReplaced and
// one line saying so. It returns the survivor's name and its stop, which
// reports how the survivor's Run ended: nil if it ran until stopped.
func Race(t testing.TB, relayURLs [2]string, token string, within time.Duration) (survivor string, stop func() error) {
	t.Helper()
	names := [2]string{"a", "b"}
	ctx, cancel := context.WithCancel(context.Background())
	errs := [2]chan error{make(chan error, 1), make(chan error, 1)}
	var hellos [2]connections
	release := make(chan struct{})
	var ready sync.WaitGroup
	for i := range names {
		ready.Add(1)
		go func() {
			ready.Done()
			<-release
			// The client is made here, after the release: its run
			// starts at the same instant as its twin's.
			c, err := tunnel.NewClient(tunnel.Config{RelayURL: relayURLs[i], Token: token, Handler: named(names[i]),
				BackoffMin: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond, OnState: hellos[i].note})
			if err != nil {
				errs[i] <- err
				return
			}
			errs[i] <- c.Run(ctx)
		}()
	}
	ready.Wait()
	close(release)
	var loser int
	select {
	case err := <-errs[0]:
		checkLoser(t, err)
		loser = 0
	case err := <-errs[1]:
		checkLoser(t, err)
		loser = 1
	case <-time.After(within):
		cancel()
		t.Fatalf("after %s neither agent had exited: both still hold on to the tunnel", within)
	}
	won := 1 - loser
	return names[won], func() error {
		select {
		case err := <-errs[won]:
			cancel()
			return errors.Join(errors.New("it exited before it was stopped"), err)
		default:
		}
		cancel()
		err := <-errs[won]
		// No ping-pong: the one that stays took the tunnel once, and
		// the one that went never took it back.
		if n := hellos[won].count(); n != 1 {
			err = errors.Join(err, fmt.Errorf("it connected %d times, want once", n))
		}
		if n := hellos[loser].count(); n > 1 {
			err = errors.Join(err, fmt.Errorf("the agent that exited connected %d times, want at most once", n))
		}
		return err
	}
}

// connections counts an agent's connections: each one's hello.
type connections struct {
	mu     sync.Mutex
	hellos map[*wire.Hello]bool // guarded by mu; a connection's hello and notices share one
}

func (c *connections) note(s tunnel.ConnState) {
	if s.State != tunnel.StateConnected || s.Hello == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.hellos == nil {
		c.hellos = map[*wire.Hello]bool{}
	}
	c.hellos[s.Hello] = true
}

func (c *connections) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.hellos)
}

// checkLoser fails t unless err is the one line of an agent sent away for
// good because its twin started later.
func checkLoser(t testing.TB, err error) {
	t.Helper()
	if !errors.Is(err, tunnel.ErrReplaced) {
		t.Fatalf("the agent that exited ended with %v, want ErrReplaced", err)
	}
	msg := err.Error()
	if strings.Contains(msg, "\n") {
		t.Errorf("the agent's error is more than one line: %q", msg)
	}
	for _, phrase := range []string{"took over", "another agent connected with the same token"} {
		if n := strings.Count(msg, phrase); n != 1 {
			t.Errorf("the error says %q %d times, want once: %v", phrase, n, msg)
		}
	}
}
