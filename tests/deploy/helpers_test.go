package deploy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// rootModule is the product's module path; repoRoot checks it to be sure
// it found the right go.mod.
const rootModule = "github.com/extauthz/extauthz"

// repoRoot returns the repository root: two levels above this package.
func repoRoot(t testing.TB) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatalf("repository root: %v", err)
	}
	if !bytes.HasPrefix(gomod, []byte("module "+rootModule+"\n")) {
		t.Fatalf("repository root %s: go.mod is not module %s", root, rootModule)
	}
	return root
}

// repoPath joins rel (slash-separated) onto the repository root.
func repoPath(t testing.TB, rel string) string {
	return filepath.Join(repoRoot(t), filepath.FromSlash(rel))
}

// rel returns path relative to the repository root, for messages.
func rel(t testing.TB, path string) string {
	r, err := filepath.Rel(repoRoot(t), path)
	if err != nil {
		return path
	}
	return filepath.ToSlash(r)
}

// globYAML returns the .yaml and .yml files under dir (relative to the
// repository root), recursively, sorted.
func globYAML(t testing.TB, dir string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(repoPath(t, dir), func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if ext := filepath.Ext(path); !d.IsDir() && (ext == ".yaml" || ext == ".yml") {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(files)
	if len(files) == 0 {
		t.Fatalf("no YAML files under %s", dir)
	}
	return files
}

// splitYAML splits a multi-document YAML file, dropping documents that
// hold only comments or whitespace.
func splitYAML(data []byte) ([][]byte, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, err
		}
		if !onlyComments(doc) {
			docs = append(docs, doc)
		}
	}
}

func onlyComments(doc []byte) bool {
	for _, line := range strings.Split(string(doc), "\n") {
		line = strings.TrimSpace(line)
		if line != "" && line != "---" && !strings.HasPrefix(line, "#") {
			return false
		}
	}
	return true
}

// strictJSON converts YAML to JSON, failing on duplicate keys.
func strictJSON(doc []byte) ([]byte, error) {
	return yaml.YAMLToJSONStrict(doc)
}

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// extauthzBinary builds cmd/extauthz once per test run, with the very
// go build command the Dockerfile runs (see dockerBuild), in a copy of the
// Docker build context, and returns its path.
func extauthzBinary(t testing.TB) string {
	t.Helper()
	bin, err := buildExtauthz()
	if err != nil {
		t.Fatalf("building extauthz as the Dockerfile does: %v", err)
	}
	return bin
}

func buildExtauthz() (string, error) {
	buildOnce.Do(func() {
		root, err := filepath.Abs(filepath.Join("..", ".."))
		if err != nil {
			buildErr = err
			return
		}
		dir, err := os.MkdirTemp("", "extauthz-deploy-test-")
		if err != nil {
			buildErr = err
			return
		}
		// Left for the OS to clean: the binary is shared by every test.
		binPath = filepath.Join(dir, "extauthz")
		buildErr = dockerBuild(root, filepath.Join(dir, "context"), binPath)
	})
	return binPath, buildErr
}

// validateSidecarConfig runs `extauthz validate` on a configuration and
// fails t if it is invalid. siblings are the files beside it (by name):
// the descriptor files its rls.domains names.
func validateSidecarConfig(t testing.TB, name string, data []byte, siblings map[string][]byte) {
	t.Helper()
	if err := extauthzValidate(name, data, siblings); err != nil {
		t.Error(err)
	}
}

// extauthzValidate runs `extauthz validate` on a configuration, with the
// files siblings beside it (by name; its rls.domains are read relative to
// it). name is where it came from, for messages. A warning (a plaintext
// key, say) is an error too: shipped configs must be clean.
func extauthzValidate(name string, data []byte, siblings map[string][]byte) error {
	_, err := extauthzValidateSummary(name, data, siblings)
	return err
}

// extauthzValidateSummary is extauthzValidate, returning what validate
// printed of the loaded configuration (the store it counts in, the
// policies), for checks of what the loader made of a file.
func extauthzValidateSummary(name string, data []byte, siblings map[string][]byte) (string, error) {
	bin, err := buildExtauthz()
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", "extauthz-validate-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	for n, content := range siblings {
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(n)), content, 0o600); err != nil {
			return "", err
		}
	}
	file := filepath.Join(dir, "extauthz-validated-"+strings.NewReplacer("/", "_", ":", "_", " ", "_").Replace(name))
	if err := os.WriteFile(file, data, 0o600); err != nil {
		return "", err
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, "validate", "-config", file)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s: extauthz validate: %v\n%s%s", name, err, stderr.String(), stdout.String())
	}
	if strings.Contains(stderr.String(), "warning") {
		return "", fmt.Errorf("%s: extauthz validate warns:\n%s", name, stderr.String())
	}
	return stdout.String(), nil
}

// problems collects what a check found, so that the same check can fail a
// test on a shipped file and be shown to catch a broken one.
type problems struct{ list []string }

func (p *problems) add(format string, args ...any) {
	p.list = append(p.list, fmt.Sprintf(format, args...))
}

// report fails t with every problem found.
func (p *problems) report(t testing.TB) {
	t.Helper()
	for _, s := range p.list {
		t.Error(s)
	}
}

// has reports whether some problem contains substr.
func (p *problems) has(substr string) bool {
	for _, s := range p.list {
		if strings.Contains(s, substr) {
			return true
		}
	}
	return false
}
