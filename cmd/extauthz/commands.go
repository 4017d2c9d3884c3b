package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime/debug"
	"sort"
	"strings"
)

// version is set at build time with -ldflags "-X main.version=v1.2.3".
var version = ""

// env bundles a command's standard streams.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
}

// command is one subcommand, registered as data.
type command struct {
	name  string
	usage string // arguments after the name
	short string
	run   func(e env, args []string) (int, error)
}

var commands = map[string]command{}

func register(c command) { commands[c.name] = c }

// errUsage marks an error caused by how the command was called.
var errUsage = errors.New("usage")

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	e := env{stdin: stdin, stdout: stdout, stderr: stderr}
	if code, ok := topLevel(args, e); ok {
		return code
	}
	name := "serve"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, args = args[0], args[1:]
	}
	cmd, ok := commands[name]
	if !ok {
		fmt.Fprintf(stderr, "extauthz: unknown command %q\n\n", name)
		printUsage(stderr)
		return 2
	}
	code, err := cmd.run(e, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "extauthz %s: %v\n", name, err)
		if errors.Is(err, errUsage) {
			fmt.Fprintf(stderr, "usage: extauthz %s %s\n", name, cmd.usage)
			return 2
		}
		if code == 0 {
			code = 1
		}
	}
	return code
}

func printUsage(w io.Writer) {
	fmt.Fprintln(w, "extauthz: rate-limiting external authorization for Envoy\n\nusage: extauthz <command> [flags]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-9s %s\n", n, commands[n].short)
	}
	fmt.Fprintln(w, "\nWith no command, extauthz serves. Run 'extauthz <command> -h' for a command's flags.")
}

func newFlags(name string, e env) *flag.FlagSet {
	fs := flag.NewFlagSet("extauthz "+name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	return fs
}

func buildVersion() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

func init() {
	register(command{
		name:  "version",
		short: "print the version",
		run: func(e env, args []string) (int, error) {
			fmt.Fprintln(e.stdout, "extauthz", buildVersion())
			return 0, nil
		},
	})
}
