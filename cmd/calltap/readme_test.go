package main

import (
	"bufio"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/calltap/calltap/relay/polltest"
)

// readmeBlocks returns the command lines of the shell blocks marked
// `<!-- readme-test: NAME -->` in the README and in the reference's topics
// (web/help/topics), by name, in order. A line ending in a backslash, or
// with a quote still open, goes on with the next.
func readmeBlocks(t *testing.T) map[string][]string {
	t.Helper()
	files := []string{filepath.Join("..", "..", "README.md")}
	topics, err := filepath.Glob(filepath.Join("..", "..", "web", "help", "topics", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := map[string][]string{}
	for _, file := range append(files, topics...) {
		markedBlocks(t, file, blocks)
	}
	if len(blocks) == 0 {
		t.Fatal("README and topics: no block marked readme-test")
	}
	return blocks
}

// markedBlocks adds the marked blocks of one Markdown file to blocks.
func markedBlocks(t *testing.T, file string, blocks map[string][]string) {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	marker := regexp.MustCompile(`^<!-- readme-test: (\S+) -->$`)
	name, inBlock, cmd := "", false, ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case name == "":
			if m := marker.FindStringSubmatch(line); m != nil {
				name = m[1]
			}
		case !inBlock:
			if line != "```sh" {
				t.Fatalf("%s: %s marks no ```sh block (next line %q)", file, name, line)
			}
			inBlock = true
		case line == "```":
			if cmd != "" {
				t.Fatalf("%s: block %s ends inside a command: %q", file, name, cmd)
			}
			name, inBlock = "", false
		default:
			cmd += line
			if strings.HasSuffix(cmd, `\`) {
				cmd = strings.TrimSuffix(cmd, `\`)
				continue
			}
			if strings.Count(cmd, "'")%2 == 1 {
				cmd += "\n"
				continue
			}
			if c := strings.TrimSpace(cmd); c != "" && !strings.HasPrefix(c, "#") {
				blocks[name] = append(blocks[name], c)
			}
			cmd = ""
		}
	}
}

// readmeRun runs README command lines as a reader would, in a shell, with
// calltap on PATH and a home of their own.
type readmeRun struct {
	t     *testing.T
	dir   string   // working directory
	env   []string // with PATH, HOME, XDG_*
	ports map[string]string
	subst map[string]string // placeholder → value
}

// line fills in the ports and placeholders, each in one pass over the
// line: replaced one after another, a port put in (127.0.0.1:40407) could
// be taken for another's README port (127.0.0.1:4040) and replaced again.
func (r *readmeRun) line(s string) string {
	s = replacer(r.ports).Replace(s)
	s = replacer(r.subst).Replace(s)
	if m := regexp.MustCompile(`<[a-z-]+>`).FindString(s); m != "" {
		r.t.Fatalf("README line %q: the test knows no value for %s", s, m)
	}
	return s
}

func replacer(m map[string]string) *strings.Replacer {
	var pairs []string
	for from, to := range m {
		pairs = append(pairs, from, to)
	}
	return strings.NewReplacer(pairs...)
}

// background starts a command that runs until Ctrl-C, with extra flags
// that move it to the test's ports (the last value of a flag wins).
func (r *readmeRun) background(line string, extra ...string) *proc {
	r.t.Helper()
	line = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(line), "&"))
	cmd := exec.Command("bash", "-c", "exec "+r.line(line)+" "+strings.Join(extra, " "))
	cmd.Dir, cmd.Env = r.dir, r.env
	p := &proc{cmd: cmd, out: &syncBuffer{}}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
		if r.t.Failed() {
			r.t.Logf("%s:\n%s", line, p.out.String())
		}
	})
	return p
}

// stopsWithKill runs line as the README says to run it in the background
// (line &), then kill $!, and checks that addr, where it listened, is free
// again: stopping what the reader started stops the server, not only a
// wrapper (go run leaves its child holding the port).
func (r *readmeRun) stopsWithKill(line, addr string) {
	r.t.Helper()
	port := addr[strings.LastIndex(addr, ":")+1:]
	script := r.line(line) + ` &
pid=$!
for _ in $(seq 1 1200); do (exec 3<>/dev/tcp/127.0.0.1/` + port + `) 2>/dev/null && break; sleep 0.1; done
kill $pid
wait $pid
true`
	r.run(script)
	polltest.Until(r.t, 30*time.Second, func() bool { return !listening(addr) },
		"after '"+line+" &' and 'kill $!', something still listens on its port")
}

// run runs a line to its end; it must exit 0.
func (r *readmeRun) run(line string) string {
	r.t.Helper()
	return r.runIn(r.dir, line)
}

// runIn is run in dir.
func (r *readmeRun) runIn(dir, line string) string {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", r.line(line))
	cmd.Dir, cmd.Env = dir, r.env
	out, err := cmd.CombinedOutput()
	if err != nil {
		r.t.Fatalf("README command %q: %v\n%s", r.line(line), err, out)
	}
	return string(out)
}

func listening(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err == nil {
		c.Close()
	}
	return err == nil
}

// The README's examples work as written: its quick start and regression
// test run against the sample handler, with only the ports moved to free
// ones and the placeholders (<tunnel-id>, <id>, <call-id>) filled in with
// what the commands before printed.
func TestReadmeExamples(t *testing.T) {
	blocks := readmeBlocks(t)
	bin := calltapBinary(t)
	home := t.TempDir()
	handlerBin := filepath.Join(t.TempDir(), "samplehandler") // the README's go build line writes it
	handler, relay, inspect, service := freeAddr(t), freeAddr(t), freeAddr(t), freeAddr(t)
	r := &readmeRun{t: t, dir: t.TempDir(),
		env: append(os.Environ(), "PATH="+filepath.Dir(bin)+string(os.PathListSeparator)+os.Getenv("PATH"), "HOME="+home,
			"XDG_DATA_HOME="+filepath.Join(home, "data"), "XDG_CONFIG_HOME="+filepath.Join(home, "config")),
		ports: map[string]string{"127.0.0.1:3000": handler, "127.0.0.1:8080": relay, "127.0.0.1:4040": inspect, "127.0.0.1:9090": service},
		subst: map[string]string{"bin/samplehandler": handlerBin},
	}
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}

	var dev *proc
	for _, line := range blocks["quickstart"] {
		switch {
		case strings.HasPrefix(line, "go build "):
			r.runIn(repo, line) // in the clone, as the reader is
		case strings.Contains(line, "samplehandler"):
			r.stopsWithKill(line, handler)
			r.background(line)
			polltest.Until(t, 2*time.Minute, func() bool { return listening(handler) }, "the sample handler did not come up")
		case strings.HasPrefix(line, "calltap dev "):
			dev = r.background(line, "--listen", relay, "--inspect", inspect)
			url := tunnelURL(t, dev)
			r.subst["<tunnel-id>"] = url[strings.LastIndex(url, "/")+1:]
		case strings.HasPrefix(line, "calltap replay <id>"):
			// <id>: the newest capture requests listed.
			out := r.run("calltap requests")
			rows := strings.Split(out, "\n")
			if len(rows) < 2 || strings.Fields(rows[1]) == nil {
				t.Fatalf("calltap requests printed %q", out)
			}
			r.subst["<id>"] = strings.Fields(rows[1])[0]
			if out := r.run(line); !strings.Contains(out, ": 200") {
				t.Errorf("%s: %s", line, out)
			}
		default:
			r.run(line)
		}
	}
	if dev == nil || r.subst["<id>"] == "" {
		t.Fatalf("the quick start ran without dev or replay: %q", blocks["quickstart"])
	}

	for _, line := range blocks["regression"] {
		switch {
		case strings.HasSuffix(line, "&"):
			r.background(line, "--listen", service)
			polltest.Until(t, 2*time.Minute, func() bool { return listening(service) }, "mock-service did not come up")
		case strings.HasPrefix(line, "curl "):
			out := r.run(line)
			m := regexp.MustCompile(`"call_id":"([^"]+)"`).FindStringSubmatch(out)
			if m == nil {
				t.Fatalf("dispatch answered %q", out)
			}
			r.subst["<call-id>"] = m[1]
			// The call's five events reach the store within seconds.
			polltest.Until(t, 2*time.Minute, func() bool {
				out := r.run("calltap requests --call-id " + m[1])
				return strings.Contains(out, "5 of 5")
			}, "the dispatched call's events did not all arrive")
		default:
			out := r.run(line)
			if strings.HasPrefix(line, "calltap replay --from") && strings.Contains(out, "did not match") {
				t.Errorf("%s:\n%s", line, out)
			}
		}
	}
	if _, ok := r.subst["<call-id>"]; !ok {
		t.Fatalf("the regression example dispatched no call: %q", blocks["regression"])
	}
}
