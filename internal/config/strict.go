package config

import (
	"bytes"
	"encoding"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"math/big"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"

	"sigs.k8s.io/yaml"
)

// keyError is a value refused by the strict check, with the full key path
// that holds it ("tiers.enterprise.weight", "models[2].decode_batch"; ""
// for the document itself).
type keyError struct {
	key    string
	reason string
}

func (e *keyError) Error() string {
	if e.key == "" {
		return e.reason
	}
	return e.key + ": " + e.reason
}

func refuse(key, format string, args ...any) error {
	return &keyError{key: key, reason: fmt.Sprintf(format, args...)}
}

// strictJSON converts YAML (or JSON, which is YAML) to JSON, refusing
// duplicate keys, and checks the document against the type of target, with
// keys matched exactly (case-sensitively) to json tags. It returns the JSON
// to decode into target: the same document, with integers written with an
// exponent (405e9) rewritten as plain integers so that encoding/json reads
// them; and the checked document itself, so that the caller can tell a key
// written as 0 from one omitted.
func strictJSON(data []byte, target reflect.Type) ([]byte, any, error) {
	return strictJSONAt("", data, target)
}

// strictJSONAt is strictJSON of a document that sits at path in a larger
// one (a tenant's entry at "tenants.NAME"), so that errors name its keys
// as the larger document would.
func strictJSONAt(path string, data []byte, target reflect.Type) ([]byte, any, error) {
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, nil, &keyError{reason: err.Error()}
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return nil, nil, &keyError{reason: err.Error()}
	}
	doc, err = check(path, target, doc)
	if err != nil {
		return nil, nil, err
	}
	js, err = json.Marshal(doc)
	return js, doc, err
}

// present reports whether key, a dotted key path, holds a non-null value in
// doc, a document strictJSON checked. A map key may itself hold dots (a
// tier named "gpu.large"), so each step tries the longest key first.
func present(doc any, key string) bool {
	if key == "" {
		return doc != nil
	}
	m, ok := doc.(map[string]any)
	if !ok {
		return false
	}
	for i := len(key); i > 0; i = strings.LastIndexByte(key[:i], '.') {
		if child, ok := m[key[:i]]; ok {
			rest := ""
			if i < len(key) {
				rest = key[i+1:]
			}
			if present(child, rest) {
				return true
			}
		}
	}
	return false
}

var (
	jsonUnmarshalerType = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// check checks v, a value decoded by encoding/json with UseNumber, against
// type t at path, as encoding/json would decode it but with exact key
// matching and whole-number checks. It returns v with integers normalised.
// A null is accepted wherever encoding/json accepts it (it leaves the
// target as it is), except that a type with its own UnmarshalJSON is asked.
func check(path string, t reflect.Type, v any) (any, error) {
	if t.Kind() == reflect.Pointer {
		if v == nil {
			return nil, nil
		}
		return check(path, t.Elem(), v)
	}
	if reflect.PointerTo(t).Implements(jsonUnmarshalerType) {
		if obj, ok := v.(map[string]any); ok && t.Kind() == reflect.Struct {
			// Its own decoder may match keys case-insensitively (as
			// pd.Model's does): hold its keys to the json tags first.
			var err error
			if v, err = checkStruct(path, t, obj); err != nil {
				return nil, err
			}
		}
		raw, err := json.Marshal(v)
		if err != nil {
			return nil, refuse(path, "%v", err)
		}
		u := reflect.New(t).Interface().(json.Unmarshaler)
		if err := u.UnmarshalJSON(raw); err != nil {
			return nil, refuse(path, "%v", err)
		}
		return v, nil
	}
	if v == nil {
		return nil, nil
	}
	if reflect.PointerTo(t).Implements(textUnmarshalerType) {
		s, ok := v.(string)
		if !ok {
			return nil, refuse(path, "want a string, got %s", describe(v))
		}
		u := reflect.New(t).Interface().(encoding.TextUnmarshaler)
		if err := u.UnmarshalText([]byte(s)); err != nil {
			return nil, refuse(path, "%v", err)
		}
		return v, nil
	}
	switch t.Kind() {
	case reflect.Struct:
		obj, ok := v.(map[string]any)
		if !ok {
			return nil, refuse(path, "want a mapping of keys, got %s", describe(v))
		}
		return checkStruct(path, t, obj)
	case reflect.Map:
		obj, ok := v.(map[string]any)
		if !ok {
			return nil, refuse(path, "want a mapping of keys, got %s", describe(v))
		}
		for _, k := range sortedKeys(obj) {
			e, err := check(join(path, k), t.Elem(), obj[k])
			if err != nil {
				return nil, err
			}
			obj[k] = e
		}
		return obj, nil
	case reflect.Slice, reflect.Array:
		if t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Uint8 {
			if _, ok := v.(string); !ok { // []byte is base64 text
				return nil, refuse(path, "want a base64 string, got %s", describe(v))
			}
			return v, nil
		}
		list, ok := v.([]any)
		if !ok {
			return nil, refuse(path, "want a list, got %s", describe(v))
		}
		if t.Kind() == reflect.Array && len(list) > t.Len() {
			return nil, refuse(path, "want at most %d entries, got %d", t.Len(), len(list))
		}
		for i, e := range list {
			e, err := check(path+"["+strconv.Itoa(i)+"]", t.Elem(), e)
			if err != nil {
				return nil, err
			}
			list[i] = e
		}
		return list, nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		n, ok := v.(json.Number)
		if !ok {
			return nil, refuse(path, "want a whole number, got %s", describe(v))
		}
		w, err := wholeNumber(n, t)
		if err != nil {
			return nil, refuse(path, "%v", err)
		}
		return w, nil
	case reflect.Float32, reflect.Float64:
		n, ok := v.(json.Number)
		if !ok {
			return nil, refuse(path, "want a number, got %s", describe(v))
		}
		if _, err := strconv.ParseFloat(string(n), t.Bits()); err != nil {
			return nil, refuse(path, "%s is out of range for a %s", n, t.Kind())
		}
		return n, nil
	case reflect.String:
		if _, ok := v.(string); !ok {
			return nil, refuse(path, "want a string, got %s (quote it)", describe(v))
		}
		return v, nil
	case reflect.Bool:
		if _, ok := v.(bool); !ok {
			return nil, refuse(path, "want true or false, got %s", describe(v))
		}
		return v, nil
	case reflect.Interface:
		return v, nil
	}
	return nil, refuse(path, "cannot be set from a config file (Go type %s)", t)
}

// checkStruct checks that every key of obj is exactly the json name of one
// of t's fields and checks each value against its field's type.
func checkStruct(path string, t reflect.Type, obj map[string]any) (map[string]any, error) {
	fields := jsonFields(t)
	for _, k := range sortedKeys(obj) {
		ft, ok := fields[k]
		if !ok {
			for name := range fields {
				if strings.EqualFold(name, k) {
					return nil, refuse(path, "unknown key %q (keys are case-sensitive: did you mean %q?)", k, name)
				}
			}
			return nil, refuse(path, "unknown key %q", k)
		}
		e, err := check(join(path, k), ft, obj[k])
		if err != nil {
			return nil, err
		}
		obj[k] = e
	}
	return obj, nil
}

// jsonFields returns the fields encoding/json decodes into a value of struct
// type t, by json name: exported fields named by their tag (or Go name),
// those tagged "-" left out, and the fields of embedded structs without a
// tag promoted, the shallowest (then the tagged) winning a name; a name
// held by two equal candidates belongs to no field, as in encoding/json.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	if f, ok := fieldCache.Load(t); ok {
		return f.(map[string]reflect.Type)
	}
	f := computeJSONFields(t)
	fieldCache.Store(t, f)
	return f
}

// fieldCache holds jsonFields' answers: a config of a million tenants asks
// for TenantConfig's fields a million times. The maps are never modified.
var fieldCache sync.Map // reflect.Type → map[string]reflect.Type

// computeJSONFields is jsonFields without the cache.
func computeJSONFields(t reflect.Type) map[string]reflect.Type {
	type cand struct {
		typ    reflect.Type
		depth  int
		tagged bool
		count  int // candidates at this depth and taggedness
	}
	best := make(map[string]cand)
	var walk func(t reflect.Type, depth int, visiting map[reflect.Type]bool)
	walk = func(t reflect.Type, depth int, visiting map[reflect.Type]bool) {
		visiting[t] = true
		defer delete(visiting, t)
		for i := range t.NumField() {
			sf := t.Field(i)
			tag := sf.Tag.Get("json")
			if tag == "-" {
				continue
			}
			name, _, _ := strings.Cut(tag, ",")
			if sf.Anonymous {
				et := sf.Type
				if et.Kind() == reflect.Pointer {
					et = et.Elem()
				}
				if !sf.IsExported() && et.Kind() != reflect.Struct {
					continue
				}
				if name == "" && et.Kind() == reflect.Struct {
					if !visiting[et] {
						walk(et, depth+1, visiting)
					}
					continue
				}
			} else if !sf.IsExported() {
				continue
			}
			c := cand{typ: sf.Type, depth: depth, tagged: name != "", count: 1}
			if name == "" {
				name = sf.Name
			}
			switch old, ok := best[name]; {
			case !ok || c.depth < old.depth || (c.depth == old.depth && c.tagged && !old.tagged):
				best[name] = c
			case c.depth == old.depth && c.tagged == old.tagged:
				old.count++
				best[name] = old
			}
		}
	}
	walk(t, 0, make(map[reflect.Type]bool))
	out := make(map[string]reflect.Type, len(best))
	for name, c := range best {
		if c.count == 1 {
			out[name] = c.typ
		}
	}
	return out
}

// wholeNumber checks that n is a whole number that fits t, an integer kind,
// and returns it without fraction or exponent (405e9 → 405000000000).
func wholeNumber(n json.Number, t reflect.Type) (json.Number, error) {
	s := string(n)
	signed := t.Kind() >= reflect.Int && t.Kind() <= reflect.Int64
	if signed {
		if _, err := strconv.ParseInt(s, 10, t.Bits()); err == nil {
			return n, nil
		}
	} else if _, err := strconv.ParseUint(s, 10, t.Bits()); err == nil {
		return n, nil
	}
	// An exponent, a fraction or out of range. Bound the magnitude before
	// the exact check, so that 1e999999999 costs nothing.
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.Abs(f) > 1<<64 {
		return "", fmt.Errorf("%s is out of range for %s", s, t.Kind())
	}
	r, ok := new(big.Rat).SetString(s)
	if !ok || !r.IsInt() {
		return "", fmt.Errorf("want a whole number, got %s", s)
	}
	i := r.Num()
	switch {
	case signed && i.IsInt64() && !reflect.Zero(t).OverflowInt(i.Int64()):
		return json.Number(i.String()), nil
	case !signed && i.IsUint64() && !reflect.Zero(t).OverflowUint(i.Uint64()):
		return json.Number(i.String()), nil
	}
	return "", fmt.Errorf("%s is out of range for %s", s, t.Kind())
}

// describe names a decoded JSON value for an error.
func describe(v any) string {
	switch v := v.(type) {
	case nil:
		return "null"
	case string:
		return fmt.Sprintf("string %q", v)
	case json.Number:
		return "number " + string(v)
	case bool:
		return strconv.FormatBool(v)
	case map[string]any:
		return "a mapping"
	case []any:
		return "a list"
	}
	return fmt.Sprintf("%T", v)
}

// join appends a map or struct key to a key path.
func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// sortedKeys returns m's keys in order, so that the first problem reported
// is the same every time.
func sortedKeys(m map[string]any) []string { return slices.Sorted(maps.Keys(m)) }
