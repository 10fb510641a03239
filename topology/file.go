package topology

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

// Limits on the shorthands, so that a typo cannot allocate a billion GPUs.
const (
	maxGPUsPerNode    = 256
	maxNodesPerDomain = 4096
)

// The file format, decoded one level at a time: every object is checked for
// unknown keys before it is decoded, so an error can name the full key path
// (domains[1].nodes[0].gpu). Nested objects are kept raw until their turn.

type fileCluster struct {
	Domains []json.RawMessage `json:"domains"`
}

type fileDomain struct {
	ID          string            `json:"id"`
	Kind        string            `json:"kind"`
	GPU         string            `json:"gpu,omitempty"`
	GPUsPerNode *int              `json:"gpus_per_node,omitempty"`
	NodePrefix  string            `json:"node_prefix,omitempty"`
	Peaks       json.RawMessage   `json:"peaks,omitempty"`
	Nodes       json.RawMessage   `json:"nodes"`             // a list of nodes, or a node count
	Engines     []json.RawMessage `json:"engines,omitempty"` // fileEngine each
}

// fileEngine is a domain's engines[] entry.
type fileEngine struct {
	Metrics string   `json:"metrics"`
	Kind    string   `json:"kind"`
	Address string   `json:"address,omitempty"`
	Models  []string `json:"models,omitempty"`
}

type fileNode struct {
	Name  string            `json:"name"`
	GPU   string            `json:"gpu,omitempty"`
	Count *int              `json:"count,omitempty"`
	Peaks json.RawMessage   `json:"peaks,omitempty"`
	GPUs  []json.RawMessage `json:"gpus,omitempty"`
}

type fileGPU struct {
	Index         *int            `json:"index,omitempty"`
	Name          string          `json:"name,omitempty"`
	UUID          *string         `json:"uuid,omitempty"`
	PCIBusID      *string         `json:"pci_bus_id,omitempty"`
	ActiveNVLinks *int            `json:"active_nvlinks,omitempty"`
	Healthy       *bool           `json:"healthy,omitempty"`
	Peaks         json.RawMessage `json:"peaks,omitempty"`
}

type filePeaks struct {
	SMs          *int     `json:"sms,omitempty"`
	FLOPS        *float64 `json:"flops,omitempty"`
	HBMBandwidth *float64 `json:"hbm_bandwidth,omitempty"`
	HBMBytes     *float64 `json:"hbm_bytes,omitempty"` // a float so that 186e9 reads
}

// peaksLayer is one peaks override and where it was written.
type peaksLayer struct {
	p    filePeaks
	path string
}

// nodeDefaults are what a domain gives its nodes.
type nodeDefaults struct {
	gpu, gpuPath string
	count        *int
	countPath    string
	peaks        []peaksLayer
}

// LoadFile reads a cluster file (YAML or JSON; see the package documentation
// for the format) and validates it. Errors name the file and the key path.
func LoadFile(path string) (Cluster, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Cluster{}, err // names the file; the caller says it is the topology
	}
	c, err := Parse(data)
	if err != nil {
		return Cluster{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// Parse decodes a cluster file (YAML or JSON; see the package documentation
// for the format) and validates the cluster. Unknown and duplicate keys are
// errors. Errors name the key path, e.g.
// `domains[1].nodes[0].gpu: unknown GPU "X100" (known: B200, GB200, H100, H200)`.
func Parse(data []byte) (Cluster, error) {
	js, err := yaml.YAMLToJSONStrict(data) // rejects duplicate keys
	if err != nil {
		return Cluster{}, err
	}
	var fc fileCluster
	if err := decodeObject(js, "", &fc); err != nil {
		return Cluster{}, err
	}
	if len(fc.Domains) == 0 {
		return Cluster{}, errors.New("domains: missing or empty")
	}
	c := Cluster{Domains: make([]Domain, 0, len(fc.Domains))}
	for i, raw := range fc.Domains {
		d, err := parseDomain(raw, fmt.Sprintf("domains[%d]", i))
		if err != nil {
			return Cluster{}, err
		}
		c.Domains = append(c.Domains, d)
	}
	if err := c.Validate(); err != nil {
		return Cluster{}, err
	}
	return c, nil
}

func parseDomain(raw json.RawMessage, path string) (Domain, error) {
	var fd fileDomain
	if err := decodeObject(raw, path, &fd); err != nil {
		return Domain{}, err
	}
	switch {
	case fd.ID == "":
		return Domain{}, fmt.Errorf("%s.id: missing", path)
	case fd.Kind == "":
		return Domain{}, fmt.Errorf("%s.kind: missing", path)
	}
	def := nodeDefaults{
		gpu: fd.GPU, gpuPath: path + ".gpu",
		count: fd.GPUsPerNode, countPath: path + ".gpus_per_node",
	}
	if l, ok, err := decodePeaks(fd.Peaks, path+".peaks"); err != nil {
		return Domain{}, err
	} else if ok {
		def.peaks = []peaksLayer{l}
	}
	d := Domain{ID: fd.ID, Kind: fd.Kind}
	for j, raw := range fd.Engines {
		epath := fmt.Sprintf("%s.engines[%d]", path, j)
		var fe fileEngine
		if err := decodeObject(raw, epath, &fe); err != nil {
			return Domain{}, err
		}
		e := Engine(fe)
		if err := e.Validate(); err != nil {
			return Domain{}, fmt.Errorf("%s.%w", epath, err)
		}
		d.Engines = append(d.Engines, e)
	}
	nodesPath := path + ".nodes"
	switch kindOf(fd.Nodes) {
	case "a list":
		if fd.NodePrefix != "" {
			return Domain{}, fmt.Errorf("%s.node_prefix: only with a node count (nodes: N)", path)
		}
		var raws []json.RawMessage
		if err := json.Unmarshal(fd.Nodes, &raws); err != nil {
			return Domain{}, fmt.Errorf("%s: %w", nodesPath, err)
		}
		if len(raws) == 0 {
			return Domain{}, fmt.Errorf("%s: empty", nodesPath)
		}
		for j, r := range raws {
			nd, err := parseNode(r, fmt.Sprintf("%s[%d]", nodesPath, j), def)
			if err != nil {
				return Domain{}, err
			}
			d.Nodes = append(d.Nodes, nd)
		}
	case "a number":
		var n int
		if err := json.Unmarshal(fd.Nodes, &n); err != nil || n < 1 || n > maxNodesPerDomain {
			return Domain{}, fmt.Errorf("%s: node count must be a whole number in [1, %d], got %s", nodesPath, maxNodesPerDomain, fd.Nodes)
		}
		if def.gpu == "" {
			return Domain{}, fmt.Errorf("%s.gpu: missing (needed with nodes: %d)", path, n)
		}
		if def.count == nil {
			return Domain{}, fmt.Errorf("%s.gpus_per_node: missing (needed with nodes: %d)", path, n)
		}
		count, err := checkCount(*def.count, def.countPath)
		if err != nil {
			return Domain{}, err
		}
		peaks, err := resolvePeaks(def.gpu, def.gpuPath, def.peaks)
		if err != nil {
			return Domain{}, err
		}
		prefix := fd.NodePrefix
		if prefix == "" {
			prefix = fd.ID + "-node"
		}
		width := max(2, len(strconv.Itoa(n)))
		for j := range n {
			name := fmt.Sprintf("%s%0*d", prefix, width, j+1)
			d.Nodes = append(d.Nodes, Node{Name: name, GPUs: shorthandGPUs(name, def.gpu, count, peaks)})
		}
	case "":
		return Domain{}, fmt.Errorf("%s: missing", nodesPath)
	default:
		return Domain{}, fmt.Errorf("%s: want a list of nodes or a node count, got %s", nodesPath, kindOf(fd.Nodes))
	}
	return d, nil
}

func parseNode(raw json.RawMessage, path string, def nodeDefaults) (Node, error) {
	var fn fileNode
	if err := decodeObject(raw, path, &fn); err != nil {
		return Node{}, err
	}
	if fn.Name == "" {
		return Node{}, fmt.Errorf("%s.name: missing", path)
	}
	gpu, gpuPath := fn.GPU, path+".gpu"
	if gpu == "" {
		gpu, gpuPath = def.gpu, def.gpuPath
	}
	layers := def.peaks
	if l, ok, err := decodePeaks(fn.Peaks, path+".peaks"); err != nil {
		return Node{}, err
	} else if ok {
		layers = append(slices.Clip(layers), l)
	}
	nd := Node{Name: fn.Name}
	if len(fn.GPUs) > 0 {
		if fn.Count != nil {
			return Node{}, fmt.Errorf("%s.count: not allowed with gpus (the list is the count)", path)
		}
		for k, r := range fn.GPUs {
			g, err := parseGPU(r, fmt.Sprintf("%s.gpus[%d]", path, k), k, fn.Name, gpu, gpuPath, layers)
			if err != nil {
				return Node{}, err
			}
			nd.GPUs = append(nd.GPUs, g)
		}
		return nd, nil
	}
	count, countPath := fn.Count, path+".count"
	if count == nil {
		if def.count == nil {
			return Node{}, fmt.Errorf("%s: missing (or set gpus_per_node on the domain)", countPath)
		}
		count, countPath = def.count, def.countPath
	}
	n, err := checkCount(*count, countPath)
	if err != nil {
		return Node{}, err
	}
	if gpu == "" {
		return Node{}, fmt.Errorf("%s.gpu: missing (set gpu on the node or on its domain)", path)
	}
	peaks, err := resolvePeaks(gpu, gpuPath, layers)
	if err != nil {
		return Node{}, err
	}
	nd.GPUs = shorthandGPUs(fn.Name, gpu, n, peaks)
	return nd, nil
}

func parseGPU(raw json.RawMessage, path string, pos int, node, defName, defPath string, layers []peaksLayer) (GPU, error) {
	var fg fileGPU
	if err := decodeObject(raw, path, &fg); err != nil {
		return GPU{}, err
	}
	name, namePath := fg.Name, path+".name"
	if name == "" {
		name, namePath = defName, defPath
	}
	if name == "" {
		return GPU{}, fmt.Errorf("%s.name: missing (or set gpu on the node or on its domain)", path)
	}
	if l, ok, err := decodePeaks(fg.Peaks, path+".peaks"); err != nil {
		return GPU{}, err
	} else if ok {
		layers = append(slices.Clip(layers), l)
	}
	peaks, err := resolvePeaks(name, namePath, layers)
	if err != nil {
		return GPU{}, err
	}
	index := pos
	if fg.Index != nil {
		if index = *fg.Index; index < 0 {
			return GPU{}, fmt.Errorf("%s.index: must not be negative, got %d", path, index)
		}
	}
	g := GPU{
		Index:         index,
		UUID:          fakeUUID(node, index),
		Name:          name,
		PCIBusID:      fakeBusID(index),
		Peaks:         peaks,
		ActiveNVLinks: defaultNVLinks(name),
		Healthy:       true,
	}
	if fg.UUID != nil {
		g.UUID = *fg.UUID
	}
	if fg.PCIBusID != nil {
		g.PCIBusID = *fg.PCIBusID
	}
	if fg.ActiveNVLinks != nil {
		if g.ActiveNVLinks = *fg.ActiveNVLinks; g.ActiveNVLinks < 0 {
			return GPU{}, fmt.Errorf("%s.active_nvlinks: must not be negative, got %d", path, g.ActiveNVLinks)
		}
	}
	if fg.Healthy != nil {
		g.Healthy = *fg.Healthy
	}
	return g, nil
}

func checkCount(n int, path string) (int, error) {
	if n < 1 || n > maxGPUsPerNode {
		return 0, fmt.Errorf("%s: must be in [1, %d], got %d", path, maxGPUsPerNode, n)
	}
	return n, nil
}

// decodePeaks decodes an optional peaks override; ok is false when absent.
func decodePeaks(raw json.RawMessage, path string) (l peaksLayer, ok bool, err error) {
	if kindOf(raw) == "" {
		return peaksLayer{}, false, nil
	}
	l.path = path
	if err := decodeObject(raw, path, &l.p); err != nil {
		return peaksLayer{}, false, err
	}
	p := l.p
	switch {
	case p.SMs != nil && *p.SMs <= 0:
		return l, false, fmt.Errorf("%s.sms: must be positive, got %d", path, *p.SMs)
	case p.FLOPS != nil && !positiveFinite(*p.FLOPS):
		return l, false, fmt.Errorf("%s.flops: must be positive, got %g", path, *p.FLOPS)
	case p.HBMBandwidth != nil && !positiveFinite(*p.HBMBandwidth):
		return l, false, fmt.Errorf("%s.hbm_bandwidth: must be positive, got %g", path, *p.HBMBandwidth)
	case p.HBMBytes != nil && (!positiveFinite(*p.HBMBytes) || *p.HBMBytes != math.Trunc(*p.HBMBytes) || *p.HBMBytes >= math.MaxInt64):
		return l, false, fmt.Errorf("%s.hbm_bytes: must be a positive whole number of bytes, got %g", path, *p.HBMBytes)
	}
	return l, true, nil
}

func positiveFinite(f float64) bool { return f > 0 && !math.IsInf(f, 0) }

// resolvePeaks gives a GPU named name its peaks: the table's, overridden
// field by field by each layer in turn (domain, node, GPU). An override makes
// the source SourceConfig. A GPU the table does not know needs every field.
func resolvePeaks(name, namePath string, layers []peaksLayer) (Peaks, error) {
	p, known := LookupGPU(name)
	for _, l := range layers {
		if l.p.SMs != nil {
			p.SMs = *l.p.SMs
		}
		if l.p.FLOPS != nil {
			p.FLOPS = *l.p.FLOPS
		}
		if l.p.HBMBandwidth != nil {
			p.HBMBandwidth = *l.p.HBMBandwidth
		}
		if l.p.HBMBytes != nil {
			p.HBMBytes = int64(*l.p.HBMBytes)
		}
		p.Source = SourceConfig
	}
	if known {
		return p, nil
	}
	if len(layers) == 0 {
		return Peaks{}, fmt.Errorf("%s: unknown GPU %q (known: %s); give peaks to use it", namePath, name, strings.Join(KnownGPUs(), ", "))
	}
	var missing []string
	for _, f := range []struct {
		name string
		zero bool
	}{{"sms", p.SMs == 0}, {"flops", p.FLOPS == 0}, {"hbm_bandwidth", p.HBMBandwidth == 0}, {"hbm_bytes", p.HBMBytes == 0}} {
		if f.zero {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return Peaks{}, fmt.Errorf("%s: unknown GPU %q needs every peak; missing %s", layers[len(layers)-1].path, name, strings.Join(missing, ", "))
	}
	return p, nil
}

// shorthandGPUs makes count identical, healthy GPUs for a node, with
// deterministic fake UUIDs and PCI bus ids.
func shorthandGPUs(node, name string, count int, peaks Peaks) []GPU {
	gpus := make([]GPU, count)
	for i := range gpus {
		gpus[i] = GPU{
			Index:         i,
			UUID:          fakeUUID(node, i),
			Name:          name,
			PCIBusID:      fakeBusID(i),
			Peaks:         peaks,
			ActiveNVLinks: defaultNVLinks(name),
			Healthy:       true,
		}
	}
	return gpus
}

// fakeUUID is a stable NVML-style UUID for GPU index i of a node.
func fakeUUID(node string, i int) string {
	sum := sha256.Sum256([]byte("sluice-gpu/" + node + "/" + strconv.Itoa(i)))
	h := hex.EncodeToString(sum[:16])
	return "GPU-" + h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// fakeBusID is a stable PCI bus id for GPU index i.
func fakeBusID(i int) string {
	return fmt.Sprintf("%08X:%02X:00.0", i/15, 0x10*(i%15+1))
}

// decodeObject decodes the JSON object raw into dst, a pointer to a struct
// whose fields all carry json tags, after checking that every key of raw is
// one of those tags (exactly: encoding/json alone would also take "ID" for
// "id"). Errors name path and the key.
func decodeObject(raw json.RawMessage, path string, dst any) error {
	if k := kindOf(raw); k != "a mapping" {
		if k == "" {
			k = "nothing"
		}
		return fmt.Errorf("%s: want a mapping, got %s", orTop(path), k)
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(raw, &keys); err != nil {
		return fmt.Errorf("%s: %w", orTop(path), err)
	}
	allowed := jsonKeys(reflect.TypeOf(dst).Elem())
	names := make([]string, 0, len(keys))
	for k := range keys {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		if !slices.Contains(allowed, k) {
			return fmt.Errorf("%s: unknown key (want one of: %s)", joinPath(path, k), strings.Join(allowed, ", "))
		}
	}
	if err := json.Unmarshal(raw, dst); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return fmt.Errorf("%s: want %s, got %s", joinPath(path, te.Field), describeType(te.Type), te.Value)
		}
		return fmt.Errorf("%s: %w", orTop(path), err)
	}
	return nil
}

// jsonKeys lists the json tag names of a struct type, in field order.
func jsonKeys(t reflect.Type) []string {
	keys := make([]string, 0, t.NumField())
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		keys = append(keys, name)
	}
	return keys
}

// kindOf names the JSON kind of raw: "a mapping", "a list", "a string",
// "a number", "true or false"; "" when raw is absent or null.
func kindOf(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	switch raw[0] {
	case '{':
		return "a mapping"
	case '[':
		return "a list"
	case '"':
		return "a string"
	case 't', 'f':
		return "true or false"
	}
	return "a number"
}

// describeType names a Go type the way the file format speaks of it.
func describeType(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Slice:
		return "a list"
	case reflect.Struct, reflect.Map:
		return "a mapping"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int64:
		return "a whole number"
	case reflect.Float64:
		return "a number"
	}
	return t.String()
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func orTop(path string) string {
	if path == "" {
		return "top level"
	}
	return path
}

// EncodeYAML writes a valid cluster in the file format, such that Parse
// gives it back equal, except that peaks whose source is not the table come
// back as SourceConfig and NVML's raw readings (GPU.MemoryBytes, the clocks,
// the bus width) are not written. An unhealthy GPU whose peaks discovery
// could not estimate is written with zero peaks, which Parse refuses until
// they are filled in. Nodes of identical healthy GPUs with default ids are
// written as {gpu, count}; other nodes list their GPUs.
func EncodeYAML(c Cluster) ([]byte, error) {
	js, err := EncodeJSON(c)
	if err != nil {
		return nil, err
	}
	out, err := yaml.JSONToYAML(js)
	if err != nil {
		return nil, fmt.Errorf("topology: encode: %w", err)
	}
	return out, nil
}

// EncodeJSON is EncodeYAML in JSON, indented.
func EncodeJSON(c Cluster) ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("topology: encode: %w", err)
	}
	fc := fileCluster{Domains: make([]json.RawMessage, len(c.Domains))}
	for i, d := range c.Domains {
		nodes := make([]fileNode, len(d.Nodes))
		for j, nd := range d.Nodes {
			nodes[j] = encodeNode(nd)
		}
		fd := fileDomain{ID: d.ID, Kind: d.Kind, Nodes: mustMarshal(nodes)}
		for _, e := range d.Engines {
			fd.Engines = append(fd.Engines, mustMarshal(fileEngine(e)))
		}
		fc.Domains[i] = mustMarshal(fd)
	}
	out, err := json.MarshalIndent(fc, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("topology: encode: %w", err)
	}
	return out, nil
}

func encodeNode(nd Node) fileNode {
	g0 := nd.GPUs[0]
	short := true
	for i, g := range nd.GPUs {
		if g.Name != g0.Name || g.Index != i || g.UUID != fakeUUID(nd.Name, i) || g.PCIBusID != fakeBusID(i) ||
			g.ActiveNVLinks != defaultNVLinks(g.Name) || !g.Healthy || g.Peaks != g0.Peaks {
			short = false
			break
		}
	}
	if short {
		n := len(nd.GPUs)
		return fileNode{Name: nd.Name, GPU: g0.Name, Count: &n, Peaks: encodePeaks(g0)}
	}
	fn := fileNode{Name: nd.Name, GPUs: make([]json.RawMessage, len(nd.GPUs))}
	for k, g := range nd.GPUs {
		fg := fileGPU{
			Name:          g.Name,
			UUID:          &g.UUID,
			PCIBusID:      &g.PCIBusID,
			ActiveNVLinks: &g.ActiveNVLinks,
			Healthy:       &g.Healthy,
			Peaks:         encodePeaks(g),
		}
		if g.Index != k {
			fg.Index = &g.Index
		}
		fn.GPUs[k] = mustMarshal(fg)
	}
	return fn
}

// encodePeaks writes a GPU's peaks in full unless they are its table's.
func encodePeaks(g GPU) json.RawMessage {
	if t, ok := LookupGPU(g.Name); ok && t == g.Peaks {
		return nil
	}
	b := float64(g.Peaks.HBMBytes)
	return mustMarshal(filePeaks{SMs: &g.Peaks.SMs, FLOPS: &g.Peaks.FLOPS, HBMBandwidth: &g.Peaks.HBMBandwidth, HBMBytes: &b})
}

// mustMarshal marshals the file structs, which hold only strings, finite
// numbers (Validate checked) and raw JSON made here, so it cannot fail.
func mustMarshal(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("topology: encode: %v", err))
	}
	return b
}
