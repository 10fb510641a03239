// Package config reads Sluice's policy (tiers, tenants, models, knobs) from
// YAML or JSON into admission.Config. It is an adapter: the file format is
// the admission package's Config with its json keys; this package adds the
// file name and the full key path to every error, rejects unknown and
// duplicate keys (matching keys case-sensitively), and embeds the default.
package config

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"reflect"

	"github.com/sluice-sched/sluice/admission"
)

//go:embed sluice.yaml
var defaultYAML []byte

// DefaultName is how errors and logs name the embedded default.
const DefaultName = "embedded:sluice.yaml"

// DefaultYAML returns the embedded default config file.
func DefaultYAML() []byte { return append([]byte(nil), defaultYAML...) }

// Default returns the embedded default config, defaulted and validated.
func Default() (admission.Config, error) { return Parse(DefaultName, defaultYAML) }

// Load reads, defaults and validates the config file at path.
func Load(path string) (admission.Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return admission.Config{}, fmt.Errorf("config %s: %w", path, err)
	}
	return Parse(path, data)
}

// Error is a refused config: the file, the key (when known) and the reason.
type Error struct {
	File   string
	Key    string
	Reason string
}

// Error formats the refusal as "config FILE: KEY: REASON".
func (e *Error) Error() string {
	if e.Key == "" {
		return fmt.Sprintf("config %s: %s", e.File, e.Reason)
	}
	return fmt.Sprintf("config %s: %s: %s", e.File, e.Key, e.Reason)
}

// Parse decodes YAML or JSON, fills defaults and validates. name is used in
// errors. A key omitted takes its default (admission.Config.ApplyDefaults
// lists them); a defaulted key written as 0 is refused with its key path,
// since 0 would not mean what it says. Decoding is strict: a duplicate key, an unknown key (keys are
// case-sensitive, exactly as written in admission.Config's json tags) or a
// value of the wrong type is an *Error whose Key is the full path of the
// value, such as "tiers.enterprise.weight" or "models[2].decode_batch".
// Integer values may be whole numbers written with an exponent (405e9).
func Parse(name string, data []byte) (admission.Config, error) {
	if base, chunks, ok := splitTenants(data); ok {
		if cfg, err, ok := parseSplit(name, base, chunks); ok {
			return cfg, err
		}
	}
	return parseWhole(name, data)
}

// parseWhole is Parse of the document in one piece: the reference the
// split parse of a large tenants block falls back to.
func parseWhole(name string, data []byte) (admission.Config, error) {
	cfg, doc, err := decode(name, data)
	if err != nil {
		return admission.Config{}, err
	}
	return finish(name, cfg, doc)
}

// decode decodes a document strictly into a Config, without defaults; doc
// is the checked document, which says which keys it wrote.
func decode(name string, data []byte) (admission.Config, any, error) {
	js, doc, err := strictJSON(data, reflect.TypeFor[admission.Config]())
	if err != nil {
		return admission.Config{}, nil, Wrap(name, err)
	}
	var cfg admission.Config
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil {
		return admission.Config{}, nil, &Error{File: name, Reason: err.Error()}
	}
	return cfg, doc, nil
}

// finish fills the defaults of the keys doc did not write and validates.
func finish(name string, cfg admission.Config, doc any) (admission.Config, error) {
	if err := cfg.ApplyDefaults(func(key string) bool { return present(doc, key) }); err != nil {
		return admission.Config{}, Wrap(name, err)
	}
	if err := cfg.Validate(); err != nil {
		return admission.Config{}, Wrap(name, err)
	}
	return cfg, nil
}

// DecodeStrict decodes YAML or JSON data into v, a non-nil pointer, as
// strictly as Parse decodes a config: a duplicate key, an unknown key (keys
// match json tags case-sensitively) or a value of the wrong type is an
// *Error naming the file and the full key path. Other files Sluice reads
// (the auth file) share it so that every file refuses the same mistakes
// with the same words.
func DecodeStrict(name string, data []byte, v any) error {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return fmt.Errorf("config.DecodeStrict: want a non-nil pointer, got %T", v)
	}
	js, _, err := strictJSON(data, rv.Type().Elem())
	if err != nil {
		return Wrap(name, err)
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return &Error{File: name, Reason: err.Error()}
	}
	return nil
}

// Wrap names the file in a validation error from the admission package
// (such as the engine refusing floors larger than the cluster); nil stays nil.
func Wrap(name string, err error) error {
	if err == nil {
		return nil
	}
	var ce *admission.ConfigError
	if errors.As(err, &ce) {
		return &Error{File: name, Key: ce.Key, Reason: ce.Reason}
	}
	var ke *keyError
	if errors.As(err, &ke) {
		return &Error{File: name, Key: ke.key, Reason: ke.reason}
	}
	return &Error{File: name, Reason: err.Error()}
}
