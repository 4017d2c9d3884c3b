package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"strings"
)

func init() {
	register(command{
		name:  "hash-key",
		short: "read an API key on stdin, print its SHA-256 for clients.keys[].sha256",
		run:   runHashKey,
	})
}

// maxKeyInput bounds what hash-key reads: API keys are short.
const maxKeyInput = 64 << 10

func runHashKey(e env, args []string) (int, error) {
	fs := newFlags("hash-key", e)
	if err := fs.Parse(args); err != nil {
		return 2, err
	}
	data, err := io.ReadAll(io.LimitReader(e.stdin, maxKeyInput+1))
	if err != nil {
		return 1, err
	}
	if len(data) > maxKeyInput {
		return 1, fmt.Errorf("input is longer than %d bytes; expected one API key", maxKeyInput)
	}
	// One trailing line ending is the shell's, not the key's.
	key := strings.TrimSuffix(strings.TrimSuffix(string(data), "\n"), "\r")
	if key == "" {
		return 1, fmt.Errorf("no key on stdin (try: printf %%s \"$KEY\" | extauthz hash-key)")
	}
	if strings.ContainsAny(key, "\r\n") {
		return 1, fmt.Errorf("input has more than one line; expected one API key")
	}
	sum := sha256.Sum256([]byte(key))
	fmt.Fprintln(e.stdout, hex.EncodeToString(sum[:]))
	return 0, nil
}
