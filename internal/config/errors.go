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

// Errors is every problem found in one configuration file.
type Errors struct {
	File string // the file's name, or "" for an unnamed source
	List []FieldError
}

func (e *Errors) add(path, format string, args ...any) {
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
	return b.String()
}

func (e *Errors) orNil() error {
	if len(e.List) == 0 {
		return nil
	}
	return e
}
