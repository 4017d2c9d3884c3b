package deploy

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerfile/shell"
	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
)

// testVersion is passed as the VERSION build argument; `extauthz version`
// must print it.
const testVersion = "deploy-test"

// dockerfile is the Dockerfile as BuildKit reads it.
type dockerfile struct {
	stages   []instructions.Stage
	metaArgs map[string]string // ARGs before the first FROM, with defaults
}

func parseDockerfile(root string) (*dockerfile, error) {
	data, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		return nil, err
	}
	return parseDockerfileText(data)
}

func parseDockerfileText(data []byte) (*dockerfile, error) {
	ast, err := parser.Parse(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("Dockerfile: %w", err)
	}
	if len(ast.Warnings) > 0 {
		return nil, fmt.Errorf("Dockerfile: %s", ast.Warnings[0].Short)
	}
	stages, metaArgs, err := instructions.Parse(ast.AST, nil)
	if err != nil {
		return nil, fmt.Errorf("Dockerfile: %w", err)
	}
	d := &dockerfile{stages: stages, metaArgs: map[string]string{}}
	for _, a := range metaArgs {
		for _, kv := range a.Args {
			if kv.Value != nil {
				d.metaArgs[kv.Key] = *kv.Value
			}
		}
	}
	return d, nil
}

// goBuild is the stage's `go build` RUN, split into words with the build
// arguments expanded.
type goBuild struct {
	stage  *instructions.Stage
	env    []string // NAME=value assignments before `go`
	args   []string // after `go build`
	output string   // the -o argument
	pkg    string   // the last argument
}

// findGoBuild returns the one RUN in the Dockerfile that runs go build,
// expanded as BuildKit would with TARGETOS=linux, TARGETARCH=goarch and
// VERSION=testVersion.
func (d *dockerfile) findGoBuild(goarch string) (*goBuild, error) {
	var found *goBuild
	for i := range d.stages {
		st := &d.stages[i]
		args := map[string]string{
			"TARGETOS": "linux", "TARGETARCH": goarch, "BUILDPLATFORM": "linux/" + runtime.GOARCH,
		}
		for _, c := range st.Commands {
			switch c := c.(type) {
			case *instructions.ArgCommand:
				for _, kv := range c.Args {
					if _, auto := args[kv.Key]; auto {
						continue
					}
					if kv.Value != nil {
						args[kv.Key] = *kv.Value
					}
					if kv.Key == "VERSION" {
						args[kv.Key] = testVersion
					}
				}
			case *instructions.RunCommand:
				line := strings.Join(c.CmdLine, " ")
				if !strings.Contains(line, "go build") {
					continue
				}
				if found != nil {
					return nil, fmt.Errorf("Dockerfile: more than one RUN runs go build")
				}
				if !c.PrependShell {
					return nil, fmt.Errorf("Dockerfile: the go build RUN must be in shell form")
				}
				var env []string
				for k, v := range args {
					env = append(env, k+"="+v)
				}
				words, err := shell.NewLex('\\').ProcessWords(line, shell.EnvsFromSlice(env))
				if err != nil {
					return nil, fmt.Errorf("Dockerfile: %s: %w", line, err)
				}
				gb := &goBuild{stage: st}
				for len(words) > 0 && strings.Contains(words[0], "=") {
					gb.env, words = append(gb.env, words[0]), words[1:]
				}
				if len(words) < 3 || words[0] != "go" || words[1] != "build" {
					return nil, fmt.Errorf("Dockerfile: want `[NAME=value...] go build ... PKG`, got %q", line)
				}
				gb.args = words[2:]
				gb.pkg = gb.args[len(gb.args)-1]
				for j, w := range gb.args {
					if w == "-o" && j+1 < len(gb.args) {
						gb.output = gb.args[j+1]
					}
				}
				found = gb
			}
		}
	}
	if found == nil {
		return nil, fmt.Errorf("Dockerfile: no RUN runs go build")
	}
	return found, nil
}

// dockerBuild runs the Dockerfile's go build on this machine: in a copy of
// the build context (the repository less .dockerignore), with the same
// environment and flags, writing the binary to out. It is how every test
// here gets its extauthz binary, so the binary the tests check is the one
// the image ships.
func dockerBuild(root, contextDir, out string) error {
	d, err := parseDockerfile(root)
	if err != nil {
		return err
	}
	gb, err := d.findGoBuild(runtime.GOARCH)
	if err != nil {
		return err
	}
	if err := copyBuildContext(root, contextDir); err != nil {
		return err
	}
	args := append([]string{"build"}, gb.args...)
	for i, a := range args {
		if a == "-o" && i+1 < len(args) {
			args[i+1] = out
		}
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = contextDir
	cmd.Env = append(os.Environ(), gb.env...)
	cmd.Env = append(cmd.Env, "GOWORK=off", "GOFLAGS=-mod=readonly -buildvcs=false")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, b)
	}
	return nil
}

// copyBuildContext copies what `docker build .` would send: every file
// under root not excluded by .dockerignore.
func copyBuildContext(root, dst string) error {
	var patterns []string
	if f, err := os.Open(filepath.Join(root, ".dockerignore")); err == nil {
		patterns, err = ignorefile.ReadAll(f)
		f.Close()
		if err != nil {
			return fmt.Errorf(".dockerignore: %w", err)
		}
	}
	pm, err := patternmatcher.New(patterns)
	if err != nil {
		return fmt.Errorf(".dockerignore: %w", err)
	}
	return filepath.WalkDir(root, func(p string, de os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		r, _ := filepath.Rel(root, p)
		if r == "." {
			return nil
		}
		skip, err := pm.MatchesOrParentMatches(filepath.ToSlash(r))
		if err != nil {
			return err
		}
		if skip {
			if de.IsDir() && !pm.Exclusions() {
				return filepath.SkipDir
			}
			return nil
		}
		target := filepath.Join(dst, r)
		if de.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if !de.Type().IsRegular() {
			return nil
		}
		return copyFile(p, target)
	})
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// TestDockerfile checks the Dockerfile as BuildKit parses it.
func TestDockerfile(t *testing.T) {
	root := repoRoot(t)
	d, err := parseDockerfile(root)
	if err != nil {
		t.Fatal(err)
	}
	var p problems
	checkDockerfile(&p, d, goModVersion(t, root))
	p.report(t)
}

// goModVersion returns the go line of the repository's go.mod.
func goModVersion(t *testing.T, root string) string {
	gomod := readFile(t, filepath.Join(root, "go.mod"))
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+(?:\.\d+)?)$`).FindSubmatch(gomod)
	if m == nil {
		t.Fatal("go.mod has no go line")
	}
	return string(m[1])
}

// checkDockerfile checks the build stage compiles ./cmd/extauthz statically
// with a new enough Go, and the final stage runs that binary as non-root
// on a minimal base.
func checkDockerfile(p *problems, d *dockerfile, goVersion string) {
	gb, err := d.findGoBuild(runtime.GOARCH)
	if err != nil {
		p.add("%v", err)
		return
	}
	if gb.pkg != "./cmd/extauthz" {
		p.add("Dockerfile: go build compiles %q, want ./cmd/extauthz", gb.pkg)
	}
	if !contains(gb.env, "CGO_ENABLED=0") {
		p.add("Dockerfile: go build runs with %q, want CGO_ENABLED=0 (a static binary for a libc-free image)", gb.env)
	}
	if !contains(gb.args, "-trimpath") {
		p.add("Dockerfile: go build %q: want -trimpath", gb.args)
	}
	if !contains(gb.env, "GOOS=linux") || !contains(gb.env, "GOARCH="+runtime.GOARCH) {
		p.add("Dockerfile: go build env %q: want GOOS and GOARCH from TARGETOS and TARGETARCH", gb.env)
	}
	if gb.output == "" {
		p.add("Dockerfile: go build %q: no -o", gb.args)
		return
	}

	// The builder image's Go must be at least go.mod's.
	var env []string
	for k, v := range d.metaArgs {
		env = append(env, k+"="+v)
	}
	base, _, err := shell.NewLex('\\').ProcessWord(gb.stage.BaseName, shell.EnvsFromSlice(env))
	if err != nil {
		p.add("Dockerfile: FROM %s: %v", gb.stage.BaseName, err)
		return
	}
	m := regexp.MustCompile(`^(?:docker\.io/)?(?:library/)?golang:(\d+\.\d+(?:\.\d+)?)`).FindStringSubmatch(base)
	if m == nil {
		p.add("Dockerfile: build stage FROM %q: want an official golang image with a version tag", base)
	} else if compareVersions(m[1], goVersion) < 0 {
		p.add("Dockerfile: build stage uses Go %s; go.mod needs %s", m[1], goVersion)
	}

	final := d.stages[len(d.stages)-1]
	if final.Name == gb.stage.Name {
		p.add("Dockerfile: the final stage is the build stage: the image would ship the Go toolchain")
		return
	}
	if final.BaseName != "scratch" && !strings.HasPrefix(final.BaseName, "gcr.io/distroless/static") {
		p.add("Dockerfile: final stage FROM %s: want scratch or gcr.io/distroless/static (the binary is static)", final.BaseName)
	}
	var user, entry string
	var copied []string // where the build stage's binary lands
	for _, c := range final.Commands {
		switch c := c.(type) {
		case *instructions.UserCommand:
			user = c.User
		case *instructions.EntrypointCommand:
			if c.PrependShell {
				p.add("Dockerfile: ENTRYPOINT %q: use the exec form; there is no shell in the image", c.CmdLine)
			} else if len(c.CmdLine) > 0 {
				entry = c.CmdLine[0]
			}
		case *instructions.CopyCommand:
			if c.From == gb.stage.Name && len(c.SourcePaths) == 1 && c.SourcePaths[0] == gb.output {
				copied = append(copied, c.DestPath)
			}
		}
	}
	uid, _, _ := strings.Cut(user, ":")
	if n, err := strconv.Atoi(uid); err != nil || n == 0 {
		p.add("Dockerfile: final stage USER %q: want a numeric non-root uid, so runAsNonRoot can check it", user)
	}
	if entry == "" {
		p.add("Dockerfile: final stage has no ENTRYPOINT")
		return
	}
	ok := false
	for _, dst := range copied {
		if dst == entry || strings.HasSuffix(dst, "/") && path.Join(dst, path.Base(gb.output)) == entry {
			ok = true
		}
	}
	if !ok {
		p.add("Dockerfile: ENTRYPOINT %s is not the binary built at %s (copied to %q)", entry, gb.output, copied)
	}
}

// TestDockerBinary checks the binary the Dockerfile's command built: it is
// static (no interpreter, no shared libraries: it runs on distroless/static
// or scratch) and reports the VERSION build argument.
func TestDockerBinary(t *testing.T) {
	bin := extauthzBinary(t)
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("extauthz has a dynamic loader (PT_INTERP): not a static binary")
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("extauthz links %q: not a static binary", libs)
	}
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("extauthz version: %v\n%s", err, out)
	}
	if !bytes.Contains(out, []byte(testVersion)) {
		t.Errorf("extauthz version printed %q, want the VERSION build argument %q", out, testVersion)
	}
}

// TestDockerignoreKeepsSources checks the build context still has what the
// build needs, and leaves out what would bust the layer cache or leak.
func TestDockerignoreKeepsSources(t *testing.T) {
	dst := t.TempDir()
	if err := copyBuildContext(repoRoot(t), dst); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"go.mod", "go.sum", "cmd/extauthz", "internal"} {
		if _, err := os.Stat(filepath.Join(dst, want)); err != nil {
			t.Errorf("build context lacks %s", want)
		}
	}
	for _, unwanted := range []string{".git", "tests", "k8s"} {
		if _, err := os.Stat(filepath.Join(dst, unwanted)); err == nil {
			t.Errorf("build context includes %s", unwanted)
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// compareVersions compares dotted decimal versions: -1, 0 or 1. A missing
// part counts as 0.
func compareVersions(a, b string) int {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(as) || i < len(bs); i++ {
		var x, y int
		if i < len(as) {
			x, _ = strconv.Atoi(as[i])
		}
		if i < len(bs) {
			y, _ = strconv.Atoi(bs[i])
		}
		if x != y {
			if x < y {
				return -1
			}
			return 1
		}
	}
	return 0
}

// TestImageRequiresAMountedConfig runs the binary the Dockerfile builds as
// the image's default command would, with the final stage's ENV,
// ENTRYPOINT and CMD and no configuration mounted: it must exit 1 saying
// where it looked, never serve the embedded demo configuration, whose API
// key is published.
func TestImageRequiresAMountedConfig(t *testing.T) {
	d, err := parseDockerfile(repoRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	final := d.stages[len(d.stages)-1]
	env := []string{"PATH=/usr/bin:/bin", "HOME=" + t.TempDir()}
	var cmd []string
	for _, c := range final.Commands {
		switch c := c.(type) {
		case *instructions.EnvCommand:
			for _, kv := range c.Env {
				env = append(env, kv.Key+"="+kv.Value)
			}
		case *instructions.CmdCommand:
			cmd = c.CmdLine
		}
	}
	var config string
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "EXTAUTHZ_CONFIG="); ok {
			config = v
		}
	}
	if config == "" {
		t.Fatal("Dockerfile: the final stage does not set EXTAUTHZ_CONFIG: the image's default command serves the embedded demo configuration and its published key")
	}
	if _, err := os.Stat(config); err == nil {
		t.Skipf("%s exists on this machine: cannot run the image's command without a configuration", config)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	run := exec.CommandContext(ctx, extauthzBinary(t), cmd...)
	run.Env, run.Dir = env, t.TempDir()
	out, err := run.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("the image's command with no configuration: %v, want exit 1\n%s", err, out)
	}
	want := "no configuration file at " + config + " (from $EXTAUTHZ_CONFIG): mount one there"
	if !strings.Contains(string(out), want) || strings.Contains(string(out), "key-demo-123") {
		t.Fatalf("the image's command with no configuration said:\n%s\nwant %q and no demo", out, want)
	}
}
