package main

import (
	"crypto/sha256"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
)

// watchConfig calls reload when the content of the file at path differs
// from parsed, the digest of the bytes the running configuration came from.
//
// It watches the file's directory, not the file: editors replace files by
// rename, and a Kubernetes ConfigMap volume swaps a `..data` symlink to a
// new directory, neither of which a watch on the old file sees. Any event
// in the directory triggers a re-read (after a short settle time, as a swap
// is several events); reload runs only when the bytes differ from the last
// ones seen. The file is also compared once as soon as the watch is in
// place, so an edit made between loading and watching is not lost. The
// returned function stops the watcher.
func watchConfig(path string, parsed [32]byte, log *slog.Logger, reload func()) (stop func(), err error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, err
	}
	dir := filepath.Dir(path)
	if err := w.Add(dir); err != nil {
		w.Close()
		return nil, err
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
				log.Warn("config watch error", "dir", dir, "error", err.Error())
			case <-settle:
				settle = nil
				if sum, ok := fileSum(path); ok && sum != last {
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
