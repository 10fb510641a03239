// Package deployfiles reads the repository's deploy/ directory (the
// Kubernetes manifests under deploy/k8s, the Prometheus rules, the Grafana
// dashboard), so that tests can hold those files to the code: that they
// parse, that every container's args are flags its binary has, that every
// metric they name is one sluiced exports. Only tests import it.
package deployfiles

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"

	"sigs.k8s.io/yaml"
)

// Dir is the repository's deploy/ directory, found from this source file,
// so that tests in any package can read the files.
func Dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "deploy")
}

// Object is one Kubernetes object as generic YAML.
type Object map[string]any

// Kind returns the object's kind.
func (o Object) Kind() string { s, _ := o["kind"].(string); return s }

// Name returns metadata.name.
func (o Object) Name() string { s, _ := Lookup(o, "metadata", "name").(string); return s }

// Lookup walks maps by key and lists by int index; nil when a step is missing.
func Lookup(v any, path ...any) any {
	if o, ok := v.(Object); ok {
		v = map[string]any(o)
	}
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[k]
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

var (
	docSep      = regexp.MustCompile(`(?m)^---\s*$`)
	lineComment = regexp.MustCompile(`(?m)^\s*#.*$`)
)

// Manifests parses every document of every k8s/*.yaml file (sigs.k8s.io/yaml:
// YAML to JSON, so numbers and keys are as the API server would read them).
func Manifests() ([]Object, error) {
	files, err := filepath.Glob(filepath.Join(Dir(), "k8s", "*.yaml"))
	if err != nil {
		return nil, fmt.Errorf("glob manifests: %w", err)
	}
	var out []Object
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("read manifest: %w", err)
		}
		for i, doc := range docSep.Split(string(data), -1) {
			if len(bytes.TrimSpace([]byte(stripComments(doc)))) == 0 {
				continue
			}
			var o Object
			if err := yaml.UnmarshalStrict([]byte(doc), &o); err != nil {
				return nil, fmt.Errorf("%s document %d: %w", filepath.Base(f), i+1, err)
			}
			out = append(out, o)
		}
	}
	return out, nil
}

// stripComments drops whole-line comments, to tell an empty document.
func stripComments(doc string) string {
	return lineComment.ReplaceAllString(doc, "")
}

// Find returns the object of kind and name.
func Find(objs []Object, kind, name string) (Object, error) {
	for _, o := range objs {
		if o.Kind() == kind && o.Name() == name {
			return o, nil
		}
	}
	return nil, fmt.Errorf("no %s %q in deploy/k8s", kind, name)
}

// ContainerArgs returns the args of the container named name in the pod
// template of the workload (Deployment, DaemonSet) of kind and name.
func ContainerArgs(kind, name string) ([]string, error) {
	objs, err := Manifests()
	if err != nil {
		return nil, err
	}
	o, err := Find(objs, kind, name)
	if err != nil {
		return nil, err
	}
	cs, _ := Lookup(o, "spec", "template", "spec", "containers").([]any)
	for _, c := range cs {
		if Lookup(c, "name") != name {
			continue
		}
		raw, _ := Lookup(c, "args").([]any)
		args := make([]string, len(raw))
		for i, a := range raw {
			s, ok := a.(string)
			if !ok {
				return nil, fmt.Errorf("%s %s: arg %d is not a string: %v", kind, name, i, a)
			}
			args[i] = s
		}
		return args, nil
	}
	return nil, fmt.Errorf("%s %s: no container %q", kind, name, name)
}
