package main

import (
	"context"
	"os"
)

// part is what every measure opens with: its results file, a scratch
// directory and the sample handler, and, for the measures of one relay and
// agent, calltap's relay. close closes them in reverse.
type part struct {
	res  *results
	dir  string
	hp   *proc
	hurl string
	ct   *calltap // nil unless opened with withRelay
	done []func()
}

// openPart opens a part's results file (out), its scratch directory (dir,
// or a new one named for name, removed at close) and the handler.
func openPart(out, dir, name string) (*part, error) {
	p := &part{}
	var err error
	if p.res, err = openResults(out); err != nil {
		return nil, err
	}
	p.done = append(p.done, p.res.close)
	if p.dir, err = scratch(dir, name); err != nil {
		p.close()
		return nil, err
	}
	scratchDir := p.dir
	p.done = append(p.done, func() { os.RemoveAll(scratchDir) })
	if p.hp, p.hurl, err = startHandler(p.dir); err != nil {
		p.close()
		return nil, err
	}
	p.done = append(p.done, p.hp.stop)
	return p, nil
}

// withRelay starts calltap's relay (bin, with relayArgs) in the part's
// directory, forwarding to its handler.
func (p *part) withRelay(ctx context.Context, bin string, relayArgs ...string) error {
	ct, err := newCalltap(ctx, bin, p.dir, p.hurl, relayArgs...)
	if err != nil {
		return err
	}
	p.ct = ct
	p.done = append(p.done, ct.stop)
	return ct.startRelay(ctx)
}

func (p *part) close() {
	for i := len(p.done) - 1; i >= 0; i-- {
		p.done[i]()
	}
}

// scratch makes a part's working directory: dir, or a new one named
// for the part.
func scratch(dir, part string) (string, error) {
	if dir != "" {
		return dir, os.MkdirAll(dir, 0o755)
	}
	return os.MkdirTemp("", "calltap-bench-"+part+"-")
}
