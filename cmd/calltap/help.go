package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/calltap/calltap/web/help"
)

// runHelp answers `calltap help [NAME]`: the commands and the topics; a
// command's flags; a topic of the reference (web/help), as plain text. A
// name that is neither exits 2 and lists what there is.
func runHelp(ctx context.Context, args []string, stdio Stdio, cmds map[string]command) int {
	if len(args) == 0 {
		usage(stdio.Out, cmds)
		return 0
	}
	if len(args) > 1 {
		return usageError(stdio, "help", "want one command or topic, got %q", strings.Join(args, " "))
	}
	name := args[0]
	if c, ok := cmds[name]; ok && c.run != nil {
		return c.run(ctx, []string{"-h"}, stdio)
	}
	if text, ok := help.Text(name); ok {
		fmt.Fprint(stdio.Out, text)
		return 0
	}
	fmt.Fprintf(stdio.Err, "calltap help: no command or topic %q; the topics are %s (see 'calltap help')\n", name, strings.Join(help.Names(), ", "))
	return 2
}

func usage(w io.Writer, cmds map[string]command) {
	fmt.Fprintln(w, "calltap — a tunnel and inspector for voice-call webhooks")
	fmt.Fprintln(w, "\nUsage: calltap <command> [flags]\n\nCommands:")
	names := make([]string, 0, len(cmds))
	for n := range cmds {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-13s %s\n", n, cmds[n].summary)
	}
	fmt.Fprintln(w, "\nTopics (calltap help TOPIC):")
	for _, t := range help.Topics() {
		fmt.Fprintf(w, "  %-13s %s\n", t.Name, t.Summary)
	}
	fmt.Fprintln(w, "\nRun 'calltap <command> -h' for a command's flags, 'calltap help TOPIC' for a topic.")
}

// command is one subcommand.
type command struct {
	run     func(ctx context.Context, args []string, stdio Stdio) int
	summary string
}
