package config

import "go.yaml.in/yaml/v3"

// DecodeYAML decodes a YAML document into v, a pointer to a struct of
// `yaml`-tagged fields, as strictly as this package decodes its own files:
// an unknown field, a value of the wrong shape or a scalar that does not
// fit its field is an error naming its path; nested aliases are bounded.
// It is for the configuration languages loaded beside ours
// (internal/rlsconfig reads envoyproxy/ratelimit's files with it). name
// prefixes every error; the result holds them all, and its Err is nil when
// there are none.
func DecodeYAML(data []byte, name string, v any) *Errors {
	errs := &Errors{File: name}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		errs.List = append(errs.List, FieldError{Msg: yamlSyntax(err)})
		return errs
	}
	decodeStrict(&doc, v, errs)
	return errs
}

// Add records a problem at path (such as `descriptors[0].key`).
func (e *Errors) Add(path, format string, args ...any) { e.add(path, format, args...) }

// Err returns e when it holds a problem, else nil.
func (e *Errors) Err() error { return e.orNil() }
