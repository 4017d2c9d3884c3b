// Package docs holds the reference the README links to. Its only code is
// this test: every relative link in README.md and docs/*.md names a file
// or directory of the repository, and every #anchor a heading of the file
// it points into, so a section moved or renamed cannot leave a dead link.
package docs

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// link is the target of an inline Markdown link, [text](target); link
// text may span lines, a target never holds a blank or a parenthesis.
var link = regexp.MustCompile(`\]\(([^()\s]+)\)`)

// codeSpan is inline code: `[a](b)` inside it is not a link.
var codeSpan = regexp.MustCompile("`[^`\n]*`")

func TestRelativeLinksResolve(t *testing.T) {
	files, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, filepath.Join("..", "README.md"))
	checked := 0
	for _, file := range files {
		text, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, target := range links(string(text)) {
			checked++
			if err := resolve(file, target); err != nil {
				t.Errorf("%s: link %s: %v", filepath.ToSlash(file), target, err)
			}
		}
	}
	if checked < 50 {
		t.Fatalf("checked %d links: the files or the link pattern changed", checked)
	}
}

// links returns the relative targets of a Markdown text's inline links,
// outside fenced code blocks and code spans.
func links(text string) []string {
	var out []string
	for _, m := range link.FindAllStringSubmatch(codeSpan.ReplaceAllString(prose(text), ""), -1) {
		target := m[1]
		if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
			continue
		}
		out = append(out, target)
	}
	return out
}

// prose is text with its fenced code blocks blanked.
func prose(text string) string {
	var b strings.Builder
	fence := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fence = !fence
			b.WriteString("\n")
			continue
		}
		if !fence {
			b.WriteString(line)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// resolve checks one target of a link in file: the path, relative to the
// file's directory, exists, and an anchor is one of its headings.
func resolve(file, target string) error {
	path, anchor, _ := strings.Cut(target, "#")
	dest := file
	if path != "" {
		dest = filepath.Join(filepath.Dir(file), filepath.FromSlash(path))
		if _, err := os.Stat(dest); err != nil {
			return fmt.Errorf("no such file or directory %s", filepath.ToSlash(dest))
		}
	}
	if anchor == "" {
		return nil
	}
	if !strings.HasSuffix(dest, ".md") {
		return fmt.Errorf("an anchor into %s, which is not Markdown", filepath.ToSlash(dest))
	}
	text, err := os.ReadFile(dest)
	if err != nil {
		return err
	}
	anchors := headingAnchors(string(text))
	if !anchors[anchor] {
		return fmt.Errorf("%s has no heading with anchor #%s", filepath.ToSlash(dest), anchor)
	}
	return nil
}

// headingAnchors returns the anchors GitHub gives a Markdown text's
// headings: lower case, punctuation dropped, blanks turned into hyphens,
// and a repeated anchor suffixed -1, -2, ...
func headingAnchors(text string) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	for _, line := range strings.Split(prose(text), "\n") {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.TrimLeft(line, "#")
		if len(line)-len(title) > 6 || !strings.HasPrefix(title, " ") {
			continue
		}
		a := slug(strings.TrimSpace(title))
		if n := seen[a]; n > 0 {
			anchors[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			anchors[a] = true
		}
		seen[a]++
	}
	return anchors
}

func slug(title string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(title) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func TestSlug(t *testing.T) {
	for title, want := range map[string]string{
		"The HTTP door: nginx, Caddy, Traefik, Envoy `http_service`": "the-http-door-nginx-caddy-traefik-envoy-http_service",
		"Key distributions in steady state (hybrid)":                 "key-distributions-in-steady-state-hybrid",
		"`rls`: Envoy's rate limit service":                          "rls-envoys-rate-limit-service",
		"Leaky bucket: `queue` and `max_delay`":                      "leaky-bucket-queue-and-max_delay",
	} {
		if got := slug(title); got != want {
			t.Errorf("slug(%q) = %q, want %q", title, got, want)
		}
	}
}
