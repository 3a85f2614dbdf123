// Package config is the one convention of apiary's library configs. A
// Config's withDefaults (or WithDefaults) fills its zero fields, and its
// Validate reports every problem at once, each a *FieldError that names
// the field at fault by its Go name (dotted for a nested config:
// Routing.QueueSize), never a command-line flag. cmd/apiary maps fields to
// its flags once (Rename), so a person reads "--queue-size must be at least
// 1, got 0" and a library caller reads "QueueSize must be at least 1, got
// 0".
package config

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// FieldError is one problem with one field. Problem may name other fields
// as {Field}; Error and Rename write them out.
type FieldError struct {
	Field   string
	Problem string
}

func (e *FieldError) Error() string { return e.render(nil) }

// fieldRef is a reference to another field inside a problem.
var fieldRef = regexp.MustCompile(`\{([A-Za-z][A-Za-z0-9.]*)\}`)

func (e *FieldError) render(names map[string]string) string {
	name := func(f string) string {
		if n, ok := names[f]; ok {
			return n
		}
		return f
	}
	problem := fieldRef.ReplaceAllStringFunc(e.Problem, func(ref string) string { return name(ref[1 : len(ref)-1]) })
	return name(e.Field) + " " + problem
}

// Problems collects the problems of one Validate.
type Problems struct{ errs []error }

// Add records a problem with field; the message is fmt.Sprintf(format, a...).
func (p *Problems) Add(field, format string, a ...any) {
	p.errs = append(p.errs, &FieldError{Field: field, Problem: fmt.Sprintf(format, a...)})
}

// Nest records the problems of a nested config's Validate: each field is
// prefixed with prefix and a dot ("": an embedded config, whose fields
// keep their names). Errors that are not FieldErrors are kept as they are.
func (p *Problems) Nest(prefix string, err error) {
	for _, e := range flatten(err) {
		var fe *FieldError
		if errors.As(e, &fe) && prefix != "" {
			n := *fe
			n.Field = prefix + "." + fe.Field
			n.Problem = fieldRef.ReplaceAllString(fe.Problem, "{"+prefix+".$1}")
			e = &n
		}
		p.errs = append(p.errs, e)
	}
}

// Err is every problem joined, or nil.
func (p *Problems) Err() error { return errors.Join(p.errs...) }

// flatten lists the errors joined in err (errors.Join trees), in order,
// also through a wrapper that adds nothing to the message (one that only
// marks the error, as a usage error).
func flatten(err error) []error {
	if err == nil {
		return nil
	}
	if w, ok := err.(interface{ Unwrap() error }); ok && w.Unwrap() != nil && w.Unwrap().Error() == err.Error() {
		return flatten(w.Unwrap())
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, flatten(e)...)
		}
		return out
	}
	return []error{err}
}

// Fields returns the FieldErrors in err.
func Fields(err error) []*FieldError {
	var out []*FieldError
	for _, e := range flatten(err) {
		var fe *FieldError
		if errors.As(e, &fe) {
			out = append(out, fe)
		}
	}
	return out
}

// Rename writes err's problems with the names names gives their fields
// (a field without a name keeps its own), one per line.
func Rename(err error, names map[string]string) error {
	if err == nil {
		return nil
	}
	var lines []string
	for _, e := range flatten(err) {
		var fe *FieldError
		if errors.As(e, &fe) && fe == e {
			lines = append(lines, fe.render(names))
			continue
		}
		lines = append(lines, e.Error())
	}
	return errors.New(strings.Join(lines, "\n"))
}

// Default sets *v to def when it is the zero value: the one step of every
// Config's withDefaults.
func Default[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// yamlError is an error of gopkg.in/yaml.v3 told without the package
// name it starts with ("yaml: line 3: …"); the cause stays wrapped.
type yamlError struct{ err error }

func (e yamlError) Error() string {
	msg := strings.TrimPrefix(e.err.Error(), "yaml: ")
	msg = strings.TrimPrefix(msg, "unmarshal errors:\n")
	return strings.TrimSpace(msg)
}
func (e yamlError) Unwrap() error { return e.err }

// YAMLError wraps an error of the YAML decoder so that its message reads
// as the file's problem, not as the decoder's package ("line 3: did not
// find expected key"); nil stays nil.
func YAMLError(err error) error {
	if err == nil {
		return nil
	}
	return yamlError{err}
}
