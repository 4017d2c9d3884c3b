package main

import (
	"bytes"
	"crypto/sha256"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
)

// watchConfig calls reload when the content of the file at path changes.
//
// It watches the file's directory, not the file: editors replace files by
// rename, and a Kubernetes ConfigMap volume swaps a `..data` symlink to a
// new directory, neither of which a watch on the old file sees. Any event
// in the directory triggers a re-read (after a short settle time, as a swap
// is several events); reload runs only when the bytes differ from the last
// ones seen. The returned function stops the watcher.
func watchConfig(path string, log *slog.Logger, reload func()) (stop func(), err error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, err
	}
	dir := filepath.Dir(path)
	if err := w.Add(dir); err != nil {
		w.Close()
		return nil, err
	}
	last := fileSum(path)
	done := make(chan struct{})
	go func() {
		defer close(done)
		var settle <-chan time.Time
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
				if sum := fileSum(path); sum != nil && !bytes.Equal(sum, last) {
					last = sum
					reload()
				}
			}
		}
	}()
	return func() { w.Close(); <-done }, nil
}

// fileSum is the SHA-256 of the file's content, following symlinks, or nil
// while it cannot be read (mid-swap).
func fileSum(path string) []byte {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	s := sha256.Sum256(data)
	return s[:]
}
