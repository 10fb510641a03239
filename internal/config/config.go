// Package config reads Sluice's policy (tiers, tenants, models, knobs) from
// YAML or JSON into admission.Config. It is an adapter: the file format is
// the admission package's Config with its json keys; this package adds the
// file name to every error, rejects unknown keys, and embeds the default.
package config

import (
	_ "embed"
	"errors"
	"fmt"
	"os"

	"sigs.k8s.io/yaml"

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

func (e *Error) Error() string {
	if e.Key == "" {
		return fmt.Sprintf("config %s: %s", e.File, e.Reason)
	}
	return fmt.Sprintf("config %s: %s: %s", e.File, e.Key, e.Reason)
}

// Parse decodes YAML or JSON (unknown keys are errors), fills defaults and
// validates. name is used in errors.
func Parse(name string, data []byte) (admission.Config, error) {
	var cfg admission.Config
	if err := yaml.UnmarshalStrict(data, &cfg); err != nil {
		return admission.Config{}, &Error{File: name, Reason: err.Error()}
	}
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return admission.Config{}, Wrap(name, err)
	}
	return cfg, nil
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
	return &Error{File: name, Reason: err.Error()}
}
