package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"runtime"
	"sync"

	"sigs.k8s.io/yaml"

	"github.com/sluice-sched/sluice/admission"
)

// A config of a million tenants is read in pieces: the tenants' block is cut
// into chunks of entries, each converted and checked alone (in parallel),
// and the rest of the document is parsed as usual. Converting the whole
// file at once would hold a tree of every tenant's YAML and JSON values,
// gigabytes, to leave a map of tens of megabytes.

// chunkEntries is how many tenants' entries one chunk of the block holds
// (a variable so that tests can cut small documents into many chunks).
var chunkEntries = 4096

// ParseTenant decodes one tenant's entry (YAML or JSON: its tier and any
// overrides), name's, from its own document, as strictly as Parse decodes a
// config: file names the document in errors, whose keys read as they would
// in a whole config ("tenants.NAME.weight"). The entry is checked alone:
// its tier's existence and its policy are checked with the config it joins.
func ParseTenant(file, name string, data []byte) (admission.TenantConfig, error) {
	if tier, ok := tierOnly(data); ok { // the JSON sluicectl config apply writes: no YAML to convert
		return admission.TenantConfig{Tier: tier}, nil
	}
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return admission.TenantConfig{}, &Error{File: file, Key: "tenants." + name, Reason: err.Error()}
	}
	tc, err := decodeTenant(name, js)
	return tc, Wrap(file, err)
}

// ParseParts is Parse of a config kept in parts, as the control plane keeps
// it: the policy document base, named name in errors, and the tenants
// decoded from their own documents by ParseTenant. A tenant both in base's
// tenants and in tenants is refused. ParseParts takes tenants over: the
// config's tenants map is tenants itself, with base's added.
func ParseParts(name string, base []byte, tenants map[string]admission.TenantConfig) (admission.Config, error) {
	cfg, doc, err := decode(name, base)
	if err != nil {
		return admission.Config{}, err
	}
	if err := merge(name, &cfg, tenants); err != nil {
		return admission.Config{}, err
	}
	return finish(name, cfg, doc)
}

// merge adds tenants to cfg's own, and has every tenant's tier name share
// the tier's key: a million copies of "standard" are a million allocations.
func merge(name string, cfg *admission.Config, tenants map[string]admission.TenantConfig) error {
	if tenants == nil {
		return nil
	}
	for t, tc := range cfg.Tenants {
		if _, dup := tenants[t]; dup {
			return &Error{File: name, Key: "tenants." + t,
				Reason: fmt.Sprintf("tenant %q is also defined in %s; define it in one place", t, name)}
		}
		tenants[t] = tc
	}
	tiers := make(map[string]string, len(cfg.Tiers))
	for tier := range cfg.Tiers {
		tiers[tier] = tier
	}
	for t, tc := range tenants {
		if key, ok := tiers[tc.Tier]; ok {
			tc.Tier = key
			tenants[t] = tc
		}
	}
	if len(tenants) > 0 || cfg.Tenants != nil {
		cfg.Tenants = tenants
	}
	return nil
}

// decodeTenant decodes a tenant's entry, JSON, strictly. The common entry,
// {"tier":"NAME"} and nothing else, is read directly.
func decodeTenant(name string, js []byte) (admission.TenantConfig, error) {
	if tier, ok := tierOnly(js); ok {
		return admission.TenantConfig{Tier: tier}, nil
	}
	js, _, err := strictJSONAt("tenants."+name, js, reflect.TypeFor[admission.TenantConfig]())
	if err != nil {
		return admission.TenantConfig{}, err
	}
	var tc admission.TenantConfig
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&tc); err != nil {
		return admission.TenantConfig{}, refuse("tenants."+name, "%v", err)
	}
	return tc, nil
}

// tierOnly reads js when it is exactly {"tier":"NAME"}, NAME without
// escapes: what YAMLToJSONStrict makes of "{tier: NAME}".
func tierOnly(js []byte) (string, bool) {
	const head, tail = `{"tier":"`, `"}`
	rest, ok := bytes.CutPrefix(js, []byte(head))
	if !ok {
		return "", false
	}
	tier, ok := bytes.CutSuffix(rest, []byte(tail))
	if !ok || bytes.ContainsAny(tier, "\"\\") {
		return "", false
	}
	return string(tier), true
}

// parseSplit parses a document cut by splitTenants: the rest of the
// document, then each chunk of the tenants' block. ok is false when a piece
// does not decode or two chunks hold one tenant: only the whole document
// then says where the mistake is, in its own lines.
func parseSplit(name string, base []byte, chunks [][]byte) (cfg admission.Config, err error, ok bool) {
	cfg, doc, err := decode(name, base)
	if err != nil {
		return admission.Config{}, nil, false
	}
	parts := make([][]tenantEntry, len(chunks))
	errs := make([]error, len(chunks))
	var wg sync.WaitGroup
	next := make(chan int)
	for range min(runtime.GOMAXPROCS(0), len(chunks)) {
		wg.Go(func() {
			for i := range next {
				parts[i], errs[i] = parseChunk(chunks[i])
			}
		})
	}
	for i := range chunks {
		next <- i
	}
	close(next)
	wg.Wait()
	size := 0
	for i, p := range parts {
		if errs[i] != nil {
			return admission.Config{}, nil, false
		}
		size += len(p)
	}
	tenants := make(map[string]admission.TenantConfig, size)
	for _, p := range parts {
		for _, e := range p {
			if _, dup := tenants[e.name]; dup {
				return admission.Config{}, nil, false
			}
			tenants[e.name] = e.tc
		}
	}
	if len(chunks) == 0 {
		tenants = nil // "tenants:" and nothing under it is a null, as in the whole document
	}
	if err := merge(name, &cfg, tenants); err != nil {
		return admission.Config{}, nil, false
	}
	cfg, err = finish(name, cfg, doc)
	return cfg, err, true
}

// tenantEntry is one tenant of a chunk.
type tenantEntry struct {
	name string
	tc   admission.TenantConfig
}

// parseChunk decodes a chunk of the tenants' block ("tenants:" and its
// entries' lines).
func parseChunk(chunk []byte) ([]tenantEntry, error) {
	js, err := yaml.YAMLToJSONStrict(chunk)
	if err != nil {
		return nil, err
	}
	var doc struct {
		Tenants map[string]json.RawMessage `json:"tenants"`
	}
	if err := json.Unmarshal(js, &doc); err != nil {
		return nil, err
	}
	out := make([]tenantEntry, 0, len(doc.Tenants))
	for n, raw := range doc.Tenants {
		tc, err := decodeTenant(n, raw)
		if err != nil {
			return nil, err
		}
		out = append(out, tenantEntry{n, tc})
	}
	return out, nil
}

// splitTenants cuts a YAML document whose top-level tenants key holds a
// block mapping ("tenants:" alone on its line at column 0, the entries
// indented under it) into the rest of the document and chunks of the
// block's entries, each chunk a document of its own ("tenants:" and the
// lines of up to chunkEntries entries). An entry starts on a line indented
// exactly as the block's first entry; YAML's indentation rules put every
// other line of the block inside the entry above it. ok is false for any
// other shape (no tenants key, a flow mapping, JSON, several documents,
// tabs): the whole document is parsed then. A cut that YAML would read
// otherwise (inside a multi-line flow value or quoted string, an alias of
// an anchor in another chunk) leaves a chunk that does not parse, and the
// whole document is parsed then too.
func splitTenants(data []byte) (base []byte, chunks [][]byte, ok bool) {
	const key = "tenants:"
	var (
		rest     []byte
		chunk    []byte
		entries  int
		indent   = -1 // the entries' indentation; -1 until the first
		inBlock  bool
		sawBlock bool
		flush    = func() {
			if entries > 0 {
				chunks = append(chunks, chunk)
			}
			chunk, entries = nil, 0
		}
	)
	for len(data) > 0 {
		line := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line = data[:i+1]
		}
		data = data[len(line):]
		body := bytes.TrimRight(line, "\r\n")
		content := bytes.TrimLeft(body, " ")
		blank := len(content) == 0 || content[0] == '#'
		if bytes.HasPrefix(body, []byte("\t")) || (len(content) > 0 && content[0] == '\t') {
			return nil, nil, false // a tab where indentation is measured
		}
		lead := len(body) - len(content)
		if !blank && lead == 0 { // a top-level line
			if bytes.HasPrefix(body, []byte("---")) || bytes.HasPrefix(body, []byte("...")) || body[0] == '%' || body[0] == '{' {
				return nil, nil, false
			}
			if inBlock {
				flush()
				inBlock = false
			}
			if after, isKey := bytes.CutPrefix(body, []byte(key)); isKey {
				after = bytes.TrimLeft(after, " ")
				if sawBlock || (len(after) > 0 && after[0] != '#') {
					return nil, nil, false // a second tenants key, or a value on its line
				}
				inBlock, sawBlock = true, true
				continue
			}
		}
		if !inBlock {
			rest = append(rest, line...)
			continue
		}
		if !blank {
			switch {
			case indent < 0:
				if content[0] == '-' {
					return nil, nil, false // a list: the whole document says why not
				}
				indent = lead
			}
			if lead == indent {
				if entries == chunkEntries {
					flush()
				}
				entries++
			}
		}
		if chunk == nil {
			chunk = append(make([]byte, 0, 64*chunkEntries), key+"\n"...)
		}
		chunk = append(chunk, line...)
		if !bytes.HasSuffix(line, []byte("\n")) {
			chunk = append(chunk, '\n')
		}
	}
	if inBlock {
		flush()
	}
	if !sawBlock {
		return nil, nil, false
	}
	return rest, chunks, true
}
