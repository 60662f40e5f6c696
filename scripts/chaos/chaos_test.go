package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// A short seeded chaos run of each mode, on calltap and nats-server built
// from this tree: only a safety violation (loss, an invented answer, a
// store that disagrees, order, once) fails it. Availability is logged, not
// asserted, so that a busy machine cannot fail it. A failure names its seed:
// `make chaos CHAOS_SEED=… CHAOS_MINUTES=1` replays the same schedule.
func TestChaos(t *testing.T) {
	dir := t.TempDir()
	calltap, nats := filepath.Join(dir, "calltap"), filepath.Join(dir, "nats-server")
	for bin, pkg := range map[string]string{calltap: "github.com/calltap/calltap/cmd/calltap", nats: "github.com/nats-io/nats-server/v2"} {
		out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	for _, tc := range []struct {
		mode   string
		single bool
		seed   int64
	}{{"single", true, 3101}, {"team", false, 3102}} {
		t.Run(tc.mode, func(t *testing.T) {
			cfg := config{minutes: 1, seed: tc.seed, single: tc.single, bin: calltap, natsBin: nats, out: filepath.Join(dir, tc.mode)}
			ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute) // bounds a hang
			defer cancel()
			res, err := run(ctx, cfg, testLog{t})
			if err != nil {
				t.Fatalf("seed %d: %v", tc.seed, err)
			}
			c := res.check
			t.Logf("%s; answers p50 %s, p99 %s, max %s; longest without a 2xx %s (bounds: %d ms, %d ms)",
				res.verdict, c.Overall.P50, c.Overall.P99, c.Overall.Max, c.Overall.No2xx, bounds.AnswerMaxMS, bounds.No2xxMaxMS)
			for _, f := range c.PerFault {
				if f.OverAnswer || f.OverNo2xx {
					t.Logf("availability past its bound: %s %s: max wait %s, longest without a 2xx %s", f.Fault.Kind, f.Fault.Target, f.Max, f.No2xx)
				}
			}
			if !res.ok {
				b, _ := os.ReadFile(filepath.Join(cfg.out, "faults.jsonl"))
				t.Fatalf("%s\nfaults:\n%s", c.Summary(20), b)
			}
		})
	}
}

// testLog sends the run's own log to the test's, shown with -v or on a
// failure.
type testLog struct{ t *testing.T }

func (w testLog) Write(p []byte) (int, error) {
	w.t.Logf("%s", p)
	return len(p), nil
}
