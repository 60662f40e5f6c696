// Package perf is how benchrun runs Linux perf on calltap's processes
// under a load and reads what perf wrote: perf stat's counts of system
// calls and context switches (here), and perf record's call stacks, each
// sample put down to a stage of the relay's or the agent's work
// (stages.go). It knows the processes only by name and pid: starting
// them is the caller's.
package perf

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/calltap/calltap/scripts/benchrun/load"
)

// span is how long perf counts or samples inside a window of d: less
// than d, so that attaching late still leaves it all under load.
func span(d time.Duration) time.Duration { return max(d*4/5, d-time.Second) }

// under runs the load spec with perf (args, for each process of procs by
// name) attached to each process as the window opens, for most of the
// window (span), and waits for every perf to end.
func under(ctx context.Context, spec load.Spec, procs []string, args func(name string) []string) (load.Result, error) {
	var cmds []*exec.Cmd
	var startErr error
	secs := fmt.Sprintf("%.3f", span(spec.Duration).Seconds())
	spec.OnStart = func() {
		for _, name := range procs {
			cmd := command(ctx, append(args(name), "--", "sleep", secs)...)
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
			startErr = cmdErr(cmd, werr)
		}
	}
	if err != nil {
		return r, err
	}
	return r, startErr
}

// command is perf with a C locale (plain numbers), its stderr kept for
// cmdErr.
func command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "perf", args...)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	cmd.Stderr = &strings.Builder{}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// cmdErr is the error of a perf run that failed, with the first line it
// printed (say, that perf_event_paranoid forbids it).
func cmdErr(cmd *exec.Cmd, err error) error {
	msg := strings.TrimSpace(fmt.Sprint(cmd.Stderr))
	msg, _, _ = strings.Cut(msg, "\n")
	return fmt.Errorf("perf %s: %w: %s", cmd.Args[1], err, msg)
}

// Counts are what perf stat counted of one process.
type Counts struct {
	Syscalls, Switches float64       // system calls; context switches, i.e. thread wake-ups
	Elapsed            time.Duration // perf's own span, over which it counted
}

// Stat runs the load spec with perf stat counting the system calls and
// context switches of each process of procs (pid by name), its output
// written in dir, and reads each one's counts.
func Stat(ctx context.Context, spec load.Spec, procs []string, pids map[string]int, dir string) (load.Result, map[string]Counts, error) {
	file := func(name string) string { return filepath.Join(dir, "stat-"+name+".txt") }
	r, err := under(ctx, spec, procs, func(name string) []string {
		return []string{"stat", "-e", "raw_syscalls:sys_enter,context-switches", "-p", strconv.Itoa(pids[name]), "-o", file(name)}
	})
	if err != nil {
		return r, nil, err
	}
	counts := map[string]Counts{}
	for _, name := range procs {
		events, elapsed, err := readStat(file(name))
		if err != nil {
			return r, nil, fmt.Errorf("perf stat of the %s: %w", name, err)
		}
		counts[name] = Counts{Syscalls: events["raw_syscalls:sys_enter"], Switches: events["context-switches"], Elapsed: elapsed}
	}
	return r, counts, nil
}

// readStat reads perf stat's output file: the count of each event
// ("<not counted>" is 0: the process did not run) and the time elapsed.
func readStat(path string) (map[string]float64, time.Duration, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, 0, err
	}
	counts := map[string]float64{}
	var elapsed time.Duration
	for _, line := range strings.Split(string(b), "\n") {
		if err := readStatLine(line, counts, &elapsed); err != nil {
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

// readStatLine reads one line of perf stat's output into counts or
// elapsed.
func readStatLine(line string, counts map[string]float64, elapsed *time.Duration) error {
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

// A Recording is perf record sampling one process's call stacks until
// Stop: the tunnel part's profiles, kept for perf report, not read here.
type Recording struct {
	cmd *exec.Cmd
}

// Record starts sampling pid's call stacks into out; nil if perf is
// missing (such profiling is optional). Stop and Wait take nil.
func Record(out string, pid int) *Recording {
	os.MkdirAll(filepath.Dir(out), 0o755)
	cmd := exec.Command("perf", "record", "-q", "-F", "499", "-g", "-p", fmt.Sprint(pid), "-o", out)
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "perf: %v\n", err)
		return nil
	}
	return &Recording{cmd: cmd}
}

// Stop tells perf to stop sampling and write its file (SIGINT).
func (r *Recording) Stop() {
	if r != nil {
		r.cmd.Process.Signal(syscall.SIGINT)
	}
}

// Wait waits for perf to have written its file.
func (r *Recording) Wait() {
	if r != nil {
		r.cmd.Wait()
	}
}
