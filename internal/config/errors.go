package config

import (
	"fmt"
	"strings"
)

// FieldError is one problem in a configuration, located by its field path,
// such as `policies[2].window`.
type FieldError struct {
	Path string
	Msg  string
}

func (e FieldError) Error() string {
	if e.Path == "" {
		return e.Msg
	}
	return e.Path + ": " + e.Msg
}

// Errors is every problem found in one configuration file, up to
// maxErrors of them.
type Errors struct {
	File    string // the file's name, or "" for an unnamed source
	List    []FieldError
	dropped int // errors past maxErrors, counted but not kept
	visited int // YAML nodes decoded, against maxValues (decode.go)
	// stopped: decoding gave up, at maxValues or at maxErrors (then
	// truncated is set too: how many more errors there were is unknown).
	stopped, truncated bool
}

// maxErrors bounds the errors kept for one file: beyond it a list helps
// nobody, and a hostile file could make it huge.
const maxErrors = 50

func (e *Errors) add(path, format string, args ...any) {
	if len(e.List) >= maxErrors {
		e.dropped++
		return
	}
	e.List = append(e.List, FieldError{Path: path, Msg: fmt.Sprintf(format, args...)})
}

func (e *Errors) Error() string {
	var b strings.Builder
	for i, fe := range e.List {
		if i > 0 {
			b.WriteByte('\n')
		}
		if e.File != "" {
			b.WriteString(e.File)
			b.WriteString(": ")
		}
		b.WriteString(fe.Error())
	}
	switch {
	case e.truncated:
		fmt.Fprintf(&b, "\n%s: and more errors; checking stopped after the first %d", e.File, maxErrors)
	case e.dropped > 0:
		fmt.Fprintf(&b, "\n%s: and %d more errors", e.File, e.dropped)
	}
	return b.String()
}

func (e *Errors) orNil() error {
	if len(e.List) == 0 {
		return nil
	}
	return e
}
