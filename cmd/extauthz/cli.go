package main

import (
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/extauthz/extauthz/internal/config"
)

// What the top level of the command line answers before any subcommand
// runs: `extauthz -h` lists the subcommands (not only serve's flags, which
// is what serve's own flag set would print), and `extauthz --version`
// answers as `extauthz version` does.

// topLevel handles -h, -help, --help, `help [COMMAND]`, -version and
// --version. ok is false when args are for a subcommand.
func topLevel(args []string, e env) (code int, ok bool) {
	if len(args) == 0 {
		return 0, false
	}
	switch args[0] {
	case "-h", "-help", "--help":
		printHelp(e.stdout)
		return 0, true
	case "help":
		if len(args) > 1 {
			if c, found := commands[args[1]]; found {
				// The command's own flag set prints its flags on -h.
				c.run(env{stdin: e.stdin, stdout: e.stdout, stderr: e.stdout}, []string{"-h"})
				return 0, true
			}
			fmt.Fprintf(e.stderr, "extauthz: unknown command %q\n\n", args[1])
			printUsage(e.stderr)
			return 2, true
		}
		printHelp(e.stdout)
		return 0, true
	case "-version", "--version":
		fmt.Fprintln(e.stdout, "extauthz", buildVersion())
		return 0, true
	}
	return 0, false
}

// printHelp is the whole top-level help: the subcommands, the flags of
// serve (the default command) and the environment.
func printHelp(w io.Writer) {
	printUsage(w)
	fmt.Fprintln(w, "\nserve (the default command):")
	commands["serve"].run(env{stdout: w, stderr: w}, []string{"-h"})
	fmt.Fprint(w, helpEnvironment)
}

const helpEnvironment = `
environment:
  Every serve flag can be given as an environment variable: EXTAUTHZ_ and
  the flag's name in capitals with - as _ (-log-level: EXTAUTHZ_LOG_LEVEL).
  A flag on the command line wins over the variable; the variable wins over
  the configuration file (listen.grpc, listen.http, listen.admin).
  EXTAUTHZ_CONFIG         the configuration file (as -config)
  EXTAUTHZ_LOG_LEVEL      debug, info, warn, error (as -log-level)
  EXTAUTHZ_LOG_FORMAT     text, json (as -log-format)
  EXTAUTHZ_LISTEN_GRPC    the Check address (as -listen-grpc)
  EXTAUTHZ_LISTEN_HTTP    the HTTP door's address (as -listen-http)
  EXTAUTHZ_LISTEN_ADMIN   the admin address (as -listen-admin)
  EXTAUTHZ_REPLICA_ID     this replica's name in Redis heartbeats (default: the hostname)
  EXTAUTHZ_ADMIN_TOKEN    the counters API's bearer token (without it the API answers 403)
  OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
                          turn tracing on: OTLP spans for Check and its Redis
                          calls (off unless one is set; OTEL_TRACES_EXPORTER=none
                          or OTEL_SDK_DISABLED=true turn it off again). The other
                          standard OTEL_* variables apply: OTEL_SERVICE_NAME,
                          OTEL_EXPORTER_OTLP_PROTOCOL (http/protobuf or grpc),
                          OTEL_TRACES_SAMPLER, OTEL_RESOURCE_ATTRIBUTES, ...
`

// envPrefix starts the environment variable of every serve flag.
const envPrefix = "EXTAUTHZ_"

// flagEnv is the environment variable that sets flag name.
func flagEnv(name string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// envDefaults sets every flag of fs that has its variable in the
// environment, before fs.Parse, so a flag on the command line still wins.
// lookup is os.LookupEnv outside tests. Each flag's help names its
// variable.
func envDefaults(fs *flag.FlagSet, lookup func(string) (string, bool)) error {
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		name := flagEnv(f.Name)
		f.Usage += " [$" + name + "]"
		v, ok := lookup(name)
		if !ok || err != nil {
			return
		}
		if serr := fs.Set(f.Name, v); serr != nil {
			err = fmt.Errorf("$%s=%q: %v", name, v, serr)
		}
	})
	return err
}

// listenOverrides are the listen addresses given by flag or environment;
// they replace the configuration file's, at start-up and at every reload,
// so a reload does not take the file's address for a change.
type listenOverrides struct {
	grpc, http, admin string
}

// apply replaces cfg's listen addresses with the overrides that are set.
func (o listenOverrides) apply(cfg *config.Config) error {
	if o.grpc != "" {
		if err := config.CheckListen(o.grpc, true); err != nil {
			return fmt.Errorf("-listen-grpc (or $%s) %q: %v", flagEnv("listen-grpc"), o.grpc, err)
		}
		cfg.Listen.GRPC = o.grpc
	}
	if o.http != "" {
		if err := config.CheckListen(o.http, true); err != nil {
			return fmt.Errorf("-listen-http (or $%s) %q: %v", flagEnv("listen-http"), o.http, err)
		}
		cfg.Listen.HTTP = o.http
	}
	if o.admin != "" {
		if err := config.CheckListen(o.admin, false); err != nil {
			return fmt.Errorf("-listen-admin (or $%s) %q: %v", flagEnv("listen-admin"), o.admin, err)
		}
		cfg.Listen.Admin = o.admin
	}
	return nil
}

// load reads the configuration file and applies the overrides.
func (o listenOverrides) load(path string) (*config.Config, error) {
	cfg, err := config.Load(path)
	if err != nil {
		return nil, err
	}
	if err := o.apply(cfg); err != nil {
		return nil, err
	}
	return cfg, nil
}
