package sidecar

import (
	"crypto/sha256"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/rlsconfig"
	"github.com/extauthz/extauthz/internal/rlsenv"
)

// sources are the files a running configuration was read from: the main
// file, and the files and directories its rls.domains names.
type sources struct {
	main string
	rls  []string
}

// sourcesOf returns the sources of cfg. A configuration read from
// envoyproxy/ratelimit's environment alone has no main file to watch.
func sourcesOf(cfg *config.Config) sources {
	if cfg.Source == rlsenv.Source {
		return sources{rls: cfg.RLS.Domains}
	}
	return sources{main: cfg.Source, rls: cfg.RLS.Domains}
}

// loadedSum is the digest of what the configuration was parsed from: the
// main file's bytes and the domain files' (rc nil: none).
func loadedSum(cfg *config.Config, rc *rlsconfig.Config) [32]byte {
	var rlsSum, mainSum [32]byte
	if rc != nil {
		rlsSum = rc.Digest
	}
	if sourcesOf(cfg).main != "" {
		mainSum = cfg.Digest
	}
	return combine(mainSum, rlsSum)
}

func combine(main, rls [32]byte) [32]byte {
	return sha256.Sum256(append(main[:], rls[:]...))
}

// sum is the digest of what the sources hold now, as loadedSum computes
// it; ok is false while one cannot be read (mid-swap).
func (s sources) sum() (sum [32]byte, ok bool) {
	var mainSum, rlsSum [32]byte
	if s.main != "" {
		if mainSum, ok = fileSum(s.main); !ok {
			return sum, false
		}
	}
	if len(s.rls) > 0 {
		if rlsSum, ok = rlsconfig.Sum(s.rls); !ok {
			return sum, false
		}
	}
	return combine(mainSum, rlsSum), true
}

// dirs are the directories to watch: each file's, and each directory
// named.
func (s sources) dirs() []string {
	seen := map[string]bool{}
	var out []string
	add := func(d string) {
		if !seen[d] {
			seen[d] = true
			out = append(out, d)
		}
	}
	if s.main != "" {
		add(filepath.Dir(s.main))
	}
	for _, p := range s.rls {
		if fi, err := os.Stat(p); err == nil && fi.IsDir() {
			add(p)
		} else {
			add(filepath.Dir(p))
		}
	}
	return out
}

// watchConfig calls reload when what the sources hold differs from
// parsed, the digest of what the running configuration came from (see
// loadedSum).
//
// It watches directories, not files: editors replace files by rename, and
// a Kubernetes ConfigMap volume swaps a `..data` symlink to a new
// directory, neither of which a watch on the old file sees; and a new
// domain file in a directory counts too. Any event in the directories
// triggers a re-read (after a short settle time, as a swap is several
// events); reload runs only when the digest differs from the last one
// seen. The sources are also compared once as soon as the watch is in
// place, so an edit made between loading and watching is not lost. The
// returned function stops the watcher.
func watchConfig(src sources, parsed [32]byte, log *slog.Logger, reload func()) (stop func(), err error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, err
	}
	dirs := src.dirs()
	for _, dir := range dirs {
		if err := w.Add(dir); err != nil {
			w.Close()
			return nil, err
		}
	}
	last := parsed
	done := make(chan struct{})
	go func() {
		defer close(done)
		settle := time.After(0) // compare once now
		for {
			select {
			case _, ok := <-w.Events:
				if !ok {
					return
				}
				settle = time.After(100 * time.Millisecond)
			case err, ok := <-w.Errors:
				if !ok {
					return
				}
				log.Warn("config watch error", "dirs", dirs, "error", err.Error())
			case <-settle:
				settle = nil
				if sum, ok := src.sum(); ok && sum != last {
					last = sum
					reload()
				}
			}
		}
	}()
	return func() { w.Close(); <-done }, nil
}

// fileSum is the SHA-256 of the file's content, following symlinks; ok is
// false while it cannot be read (mid-swap) or is not a regular file. The
// file is opened without blocking, so a FIFO put in its place cannot stall
// the watch (and with it, shutdown, which waits for the watch to end); a
// reload (SIGHUP) still reads whatever the path names.
func fileSum(path string) (sum [32]byte, ok bool) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return sum, false
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return sum, false
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return sum, false
	}
	h.Sum(sum[:0])
	return sum, true
}

// watcher is the configuration watch, replaced when a reload names other
// domain files. Safe for concurrent use: reloads replace it on their
// goroutine while shutdown stops it from another.
type watcher struct {
	log     *slog.Logger
	changed func() // what a change to the sources calls

	mu     sync.Mutex // guards stop and closed
	stop   func()     // stops the running watch; nil: none
	closed bool       // close ran: no watch starts again
}

func newWatcher(log *slog.Logger, changed func()) *watcher {
	return &watcher{log: log, changed: changed}
}

// watch replaces the running watch, if any, by one of src, which was
// parsed from what digest sums. A watch that cannot start is logged:
// SIGHUP still reloads. After close it does nothing.
func (w *watcher) watch(src sources, digest [32]byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	w.stopLocked()
	if src.main == config.EmbeddedSource || len(src.dirs()) == 0 {
		return // nothing on disk to watch (the descriptors come over xDS)
	}
	stop, err := watchConfig(src, digest, w.log, w.changed)
	if err != nil {
		w.log.Warn("cannot watch the configuration files; reload with SIGHUP", "config", src.main, "error", err.Error())
		return
	}
	w.stop = stop
}

// close stops the running watch for good.
func (w *watcher) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopLocked()
	w.closed = true
}

func (w *watcher) stopLocked() {
	if w.stop != nil {
		w.stop()
		w.stop = nil
	}
}
