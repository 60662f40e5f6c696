package main

import (
	"context"
	"net"
	"net/http"
	"sync"
	"time"
)

// Running a command's parts together, and serving HTTP as one of them.

// runParts runs every part until one of them returns or ctx ends, then
// cancels the others and waits for all of them. A part that must stop in
// stages does so itself once its context ends (relay.Server.Serve, the
// tunnel's leave, agent.Agent.Run). It returns the first
// error a part returned on its own, before anything asked it to stop: a
// part that ends (a revoked tunnel, a listener that failed) ends the
// command, instead of leaving the others running for nobody.
func runParts(ctx context.Context, parts ...func(context.Context) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	for _, run := range parts {
		wg.Go(func() {
			err := run(ctx)
			once.Do(func() {
				if ctx.Err() == nil {
					first = err
				}
				cancel()
			})
		})
	}
	wg.Wait()
	return first
}

// serveHTTP is a part that serves hs on ln until ctx ends, then gives the
// requests in flight up to grace to finish.
func serveHTTP(hs *http.Server, ln net.Listener, grace time.Duration) func(context.Context) error {
	return func(ctx context.Context) error {
		served := make(chan error, 1)
		go func() { served <- hs.Serve(ln) }()
		select {
		case err := <-served:
			return err
		case <-ctx.Done():
		}
		shutdownCtx, cancel := context.WithTimeout(context.Background(), grace)
		defer cancel()
		if err := hs.Shutdown(shutdownCtx); err != nil {
			hs.Close() // long-lived streams (the inspector's live list) end here
		}
		<-served
		return nil
	}
}

// httpGrace is how long a server stopping waits for its requests in flight.
const httpGrace = 5 * time.Second
