package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/calltap/calltap/scripts/benchrun/load"
)

// How the cost part runs perf on the processes under load, and reads what
// perf stat counted.

// perfSpan is how long perf counts or samples inside a window of d: less
// than d, so that attaching late still leaves it all under load.
func perfSpan(d time.Duration) time.Duration { return max(d*4/5, d-time.Second) }

// underPerf runs the load spec with perf (args, for each process of
// procs by name) attached to each process as the window opens, for most
// of the window (perfSpan), and waits for every perf to end.
func underPerf(ctx context.Context, spec load.Spec, procs []string, args func(name string) []string) (load.Result, error) {
	var cmds []*exec.Cmd
	var startErr error
	span := fmt.Sprintf("%.3f", perfSpan(spec.Duration).Seconds())
	spec.OnStart = func() {
		for _, name := range procs {
			cmd := perfCmd(ctx, append(args(name), "--", "sleep", span)...)
			if err := cmd.Start(); err != nil {
				startErr = fmt.Errorf("perf %s: %w", cmd.Args[1], err)
				break
			}
			cmds = append(cmds, cmd)
		}
	}
	r, err := load.Run(ctx, spec)
	for _, cmd := range cmds {
		if werr := cmd.Wait(); werr != nil && startErr == nil {
			startErr = perfErr(cmd, werr)
		}
	}
	if err != nil {
		return r, err
	}
	return r, startErr
}

// perfCmd is perf with a C locale (plain numbers), its stderr kept for
// perfErr.
func perfCmd(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "perf", args...)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	cmd.Stderr = &strings.Builder{}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// perfErr is the error of a perf run that failed, with the first line it
// printed (say, that perf_event_paranoid forbids it).
func perfErr(cmd *exec.Cmd, err error) error {
	msg := strings.TrimSpace(fmt.Sprint(cmd.Stderr))
	msg, _, _ = strings.Cut(msg, "\n")
	return fmt.Errorf("perf %s: %w: %s", cmd.Args[1], err, msg)
}

// readPerfStat reads perf stat's output file: the count of each event
// ("<not counted>" is 0: the process did not run) and the time elapsed.
func readPerfStat(path string) (map[string]float64, time.Duration, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, 0, err
	}
	counts := map[string]float64{}
	var elapsed time.Duration
	for _, line := range strings.Split(string(b), "\n") {
		if err := readPerfLine(line, counts, &elapsed); err != nil {
			return nil, 0, err
		}
	}
	if elapsed <= 0 {
		return nil, 0, fmt.Errorf("%s: no time elapsed", path)
	}
	for _, ev := range []string{"raw_syscalls:sys_enter", "context-switches"} {
		if _, ok := counts[ev]; !ok {
			return nil, 0, fmt.Errorf("%s: no count of %s", path, ev)
		}
	}
	return counts, elapsed, nil
}

// readPerfLine reads one line of perf stat's output into counts or
// elapsed.
func readPerfLine(line string, counts map[string]float64, elapsed *time.Duration) error {
	f := strings.Fields(line)
	switch {
	case len(f) >= 4 && f[1] == "seconds" && f[2] == "time" && f[3] == "elapsed":
		s, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return fmt.Errorf("unreadable elapsed time %q", line)
		}
		*elapsed = time.Duration(s * float64(time.Second))
	case len(f) >= 3 && f[0] == "<not" && f[1] == "counted>":
		counts[f[2]] = 0
	case len(f) >= 2 && (strings.Contains(f[1], ":") || f[1] == "context-switches" || f[1] == "cs"):
		if v, err := strconv.ParseFloat(strings.ReplaceAll(f[0], ",", ""), 64); err == nil {
			counts[f[1]] = v
		}
	}
	return nil
}
