package config

import (
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// decodeStrict walks a YAML node tree into v, a pointer to a struct of
// `yaml`-tagged fields, and records every problem with its field path:
// unknown fields, wrong shapes and scalars that do not fit their field.
// Scalars themselves are decoded by yaml.v3; this walker only adds the
// strictness and the paths that yaml.v3's KnownFields errors lack.
func decodeStrict(n *yaml.Node, v any, errs *Errors) {
	decodeValue(n, reflect.ValueOf(v).Elem(), "", errs)
}

// maxValues bounds the YAML nodes one file may decode, aliases expanded,
// every mapping key and list item counted whether it is decoded or
// refused: a real configuration has thousands at most, while a few
// kilobytes of nested aliases ("billion laughs") expand to billions, and
// a mapping of unknown fields aliased a thousand times costs a million
// refusals. Decoding also stops once maxErrors are kept, so a hostile
// file costs at most maxValues steps, however it is built.
const maxValues = 200_000

// visit counts n nodes toward maxValues and reports whether decoding
// goes on: false once the bound is passed (reported once) or the error
// list is full.
func (e *Errors) visit(n int) bool {
	if e.stopped {
		return false
	}
	e.visited += n
	if e.visited > maxValues {
		e.stopped = true
		e.List = append(e.List, FieldError{Msg: fmt.Sprintf("the document expands to more than %d values (nested aliases?)", maxValues)})
		return false
	}
	if len(e.List) >= maxErrors {
		e.stopped, e.truncated = true, true
		return false
	}
	return true
}

func decodeValue(n *yaml.Node, v reflect.Value, path string, errs *Errors) {
	if !errs.visit(1) {
		return
	}
	for n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			return
		}
		decodeValue(n.Content[0], v, path, errs)
		return
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return // an explicit null leaves the zero value
	}
	if v.CanAddr() {
		if d, ok := v.Addr().Interface().(nodeDecoder); ok {
			d.decodeNode(n, path, errs)
			return
		}
	}
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		decodeValue(n, v.Elem(), path, errs)
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			errs.add(path, "expected a mapping, got %s", describe(n))
			return
		}
		fields := structFields(v.Type())
		for i := 0; i+1 < len(n.Content); i += 2 {
			if !errs.visit(1) { // the key, decoded or refused
				return
			}
			name := n.Content[i].Value
			idx, ok := fields[name]
			if !ok {
				errs.add(join(path, name), "unknown field; known fields: %s", knownFields(fields))
				continue
			}
			decodeValue(n.Content[i+1], v.Field(idx), join(path, name), errs)
		}
	case reflect.Slice:
		if n.Kind == yaml.ScalarNode {
			// A single value where a list is expected is a list of one.
			v.Set(reflect.MakeSlice(v.Type(), 1, 1))
			decodeValue(n, v.Index(0), path+"[0]", errs)
			return
		}
		if n.Kind != yaml.SequenceNode {
			errs.add(path, "expected a list, got %s", describe(n))
			return
		}
		v.Set(reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content)))
		for i, item := range n.Content {
			decodeValue(item, v.Index(i), fmt.Sprintf("%s[%d]", path, i), errs)
		}
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			errs.add(path, "expected a mapping, got %s", describe(n))
			return
		}
		if v.IsNil() {
			v.Set(reflect.MakeMap(v.Type()))
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			if !errs.visit(1) {
				return
			}
			key := n.Content[i].Value
			elem := reflect.New(v.Type().Elem()).Elem()
			decodeValue(n.Content[i+1], elem, join(path, key), errs)
			v.SetMapIndex(reflect.ValueOf(key).Convert(v.Type().Key()), elem)
		}
	default:
		if n.Kind != yaml.ScalarNode {
			errs.add(path, "expected %s, got %s", kindName(v.Kind()), describe(n))
			return
		}
		if v.Kind() == reflect.String && n.ShortTag() == "!!str" {
			v.SetString(n.Value) // the common case, without a decoder per scalar
			return
		}
		if err := n.Decode(v.Addr().Interface()); err != nil {
			errs.add(path, "%s is not %s", strconv.Quote(n.Value), kindName(v.Kind()))
		}
	}
}

// nodeDecoder is a field type that decodes itself, for settings that take
// more than one shape (such as `tls: true` or `tls: {ca_file: ...}`).
type nodeDecoder interface {
	decodeNode(n *yaml.Node, path string, errs *Errors)
}

func structFields(t reflect.Type) map[string]int {
	m := make(map[string]int, t.NumField())
	for i := 0; i < t.NumField(); i++ {
		tag := strings.Split(t.Field(i).Tag.Get("yaml"), ",")[0]
		if tag != "" && tag != "-" {
			m[tag] = i
		}
	}
	return m
}

func knownFields(fields map[string]int) string {
	names := make([]string, 0, len(fields))
	for n := range fields {
		names = append(names, n)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

// join appends a mapping key to a path. A key that could be mistaken for
// path syntax or forge a line of output (dots, brackets, quotes, control
// characters) is quoted.
func join(path, name string) string {
	if name == "" || strings.ContainsFunc(name, func(r rune) bool {
		return r < 0x20 || r == 0x7f || r == '.' || r == '[' || r == ']' || r == '"' || r == ' ' || !strconv.IsPrint(r)
	}) {
		name = strconv.Quote(name)
	}
	if path == "" {
		return name
	}
	return path + "." + name
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	default:
		return strconv.Quote(n.Value)
	}
}

func kindName(k reflect.Kind) string {
	switch k {
	case reflect.Bool:
		return "a boolean (true or false)"
	case reflect.Int, reflect.Int64, reflect.Int32, reflect.Uint, reflect.Uint64, reflect.Uint32:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	default:
		return "a string"
	}
}
