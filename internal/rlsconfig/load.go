package rlsconfig

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/extauthz/extauthz/internal/config"
)

// Load reads every file the paths name (a directory contributes its
// *.yaml and *.yml files, in name order, leaving out hidden entries such
// as a Kubernetes ConfigMap's ..data), each holding one domain, and checks
// them. Two files may not define the same domain. The error lists every
// problem found, each with its file and field path.
func Load(paths []string, o Options) (*Config, error) {
	files, err := Files(paths, o.Source)
	if err != nil {
		return nil, err
	}
	c := &Config{Domains: map[string]*Domain{}, Files: files}
	h := sha256.New()
	var errs []error
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", f, errors.Unwrap(err)))
			continue
		}
		hashFile(h, f, data)
		d, warnings, err := parse(data, f, o)
		c.Warnings = append(c.Warnings, warnings...)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if prev, dup := c.Domains[d.Name]; dup {
			errs = append(errs, fmt.Errorf("%s: domain: %q is already defined in %s", f, d.Name, prev.File))
			continue
		}
		c.Domains[d.Name] = d
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	copy(c.Digest[:], h.Sum(nil))
	return c, nil
}

// Parse reads one file's domain; name prefixes every error.
func Parse(data []byte, name string, o Options) (*Domain, error) {
	d, _, err := parse(data, name, o)
	return d, err
}

// Files lists the files the paths name, as Load reads them. source names
// the configuration the paths come from, for the error about one that
// cannot be read.
func Files(paths []string, source string) ([]string, error) {
	var files []string
	for i, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("%s: rls.domains[%d]: %q cannot be read: %w", source, i, p, errors.Unwrap(err))
		}
		if !fi.IsDir() {
			files = append(files, p)
			continue
		}
		entries, err := os.ReadDir(p)
		if err != nil {
			return nil, fmt.Errorf("%s: rls.domains[%d]: %q cannot be read: %w", source, i, p, errors.Unwrap(err))
		}
		var found []string
		for _, e := range entries {
			name := e.Name()
			if strings.HasPrefix(name, ".") || (filepath.Ext(name) != ".yaml" && filepath.Ext(name) != ".yml") {
				continue
			}
			full := filepath.Join(p, name)
			// A ConfigMap's files are symlinks: follow them, and leave
			// out what is not a file (a directory named x.yaml). One
			// that cannot be followed (a dangling link, a loop) is an
			// error, as naming the file directly is: leaving it out
			// would drop its domain, unlimited, from a reload that
			// reports success.
			fi, err := os.Stat(full)
			if err != nil {
				return nil, fmt.Errorf("%s: rls.domains[%d]: %q cannot be read: %w", source, i, full, errors.Unwrap(err))
			}
			if fi.Mode().IsRegular() {
				found = append(found, full)
			}
		}
		sort.Strings(found)
		files = append(files, found...)
	}
	return files, nil
}

// Sum is the digest Load would record for the paths now, and whether every
// file could be read: the configuration watch compares it to the running
// configuration's Digest.
func Sum(paths []string) ([32]byte, bool) {
	var sum [32]byte
	files, err := Files(paths, "")
	if err != nil {
		return sum, false
	}
	h := sha256.New()
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return sum, false
		}
		hashFile(h, f, data)
	}
	copy(sum[:], h.Sum(nil))
	return sum, true
}

// hashFile adds one file, its name and its length to the digest, so a
// renamed or split file changes it too.
func hashFile(h hash.Hash, name string, data []byte) {
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(name)))
	h.Write(n[:])
	h.Write([]byte(name))
	binary.BigEndian.PutUint64(n[:], uint64(len(data)))
	h.Write(n[:])
	h.Write(data)
}

// Source is one configuration held in memory (a resource sent over xDS):
// Name prefixes its errors, Data is its YAML.
type Source struct {
	Name string
	Data []byte
}

// LoadSources checks configurations held in memory as Load checks files:
// one domain each, no domain twice, every problem reported with its
// source's name and field path.
func LoadSources(srcs []Source, o Options) (*Config, error) {
	c := &Config{Domains: map[string]*Domain{}}
	h := sha256.New()
	var errs []error
	for _, s := range srcs {
		hashFile(h, s.Name, s.Data)
		d, warnings, err := parse(s.Data, s.Name, o)
		c.Warnings = append(c.Warnings, warnings...)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if prev, dup := c.Domains[d.Name]; dup {
			errs = append(errs, fmt.Errorf("%s: domain: %q is already defined in %s", s.Name, d.Name, prev.File))
			continue
		}
		c.Domains[d.Name] = d
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	copy(c.Digest[:], h.Sum(nil))
	return c, nil
}

// LoadFor reads the domain files the main configuration cfg names, with
// its per-limit defaults (nil when it names none).
func LoadFor(cfg *config.Config) (*Config, error) {
	if len(cfg.RLS.Domains) == 0 {
		return nil, nil
	}
	return Load(cfg.RLS.Domains, OptionsFor(cfg))
}

// WarningsOf returns the warnings of a descriptor configuration that may
// be nil (no domain files).
func WarningsOf(rc *Config) []string {
	if rc == nil {
		return nil
	}
	return rc.Warnings
}
