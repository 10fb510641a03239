// Package fleetgen writes the files of a fleet at scale, for the benchmarks
// and the tests that run sluiced at the size it is for: a topology file of N
// GB200 NVL72 domains (each one NVLink clique of 18 compute trays × 4 GPUs,
// as topology.Simulated lays its two racks out) and a config of T tenants on
// one tier whose quotas never bind, so that every Admit is a full decision
// that admits at once and a measurement reads the decision path, not a
// refusal.
//
// Nothing it writes is committed: a million tenants are 30 MB of YAML,
// written in a tenth of a second. The files are plain topology and config
// files (topology/file.go's format, internal/config's), read by sluiced's
// --topology and --config like any other.
//
// Tenants are named by TenantFormat with their index, 0 to T−1, so that
// `sluicectl load --tenant-pool` draws from them without listing them
// (Files.TenantPool gives the value).
package fleetgen

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
)

// Bounds on a Spec, so that a typo cannot fill the disk: a 100k-GPU fleet
// is ~1,400 NVL72 domains, an inference platform's API keys ~1M.
const (
	MaxDomains = 100_000
	MaxTenants = 10_000_000
)

// The files' names in the directory Write fills.
const (
	TopologyFile = "topology.yaml"
	ConfigFile   = "config.yaml"
)

// NVL72 is the shape of one domain: a GB200 NVL72 rack, one NVLink clique.
const (
	NVL72GPU        = "NVIDIA GB200"
	NVL72Trays      = 18
	NVL72GPUsOnTray = 4
)

// Spec says what fleet to write.
type Spec struct {
	Domains int // NVL72 domains
	Tenants int // configured tenants
	// Model is the model tier Files.TenantPool names (default "small").
	Model string
}

// Files says what Write wrote.
type Files struct {
	Dir      string `json:"dir"`
	Topology string `json:"topology"` // sluiced --topology
	Config   string `json:"config"`   // sluiced --config
	Domains  int    `json:"domains"`
	GPUs     int    `json:"gpus"`
	Tenants  int    `json:"tenants"`
	// TenantFormat names tenant i: fmt.Sprintf(TenantFormat, i).
	TenantFormat string `json:"tenantFormat"`
	// TenantPool is the `sluicectl load --tenant-pool` value that draws
	// every call's tenant from all of them.
	TenantPool string `json:"tenantPool"`
}

// Validate reports the first field out of bounds.
func (s *Spec) Validate() error {
	switch {
	case s.Domains < 1 || s.Domains > MaxDomains:
		return fmt.Errorf("--domains %d: want 1 to %d", s.Domains, MaxDomains)
	case s.Tenants < 1 || s.Tenants > MaxTenants:
		return fmt.Errorf("--tenants %d: want 1 to %d", s.Tenants, MaxTenants)
	}
	return nil
}

// TenantFormat is the format of s's tenant names: "fleet-%06d" for a
// million, zero-padded to the width of the last index so that they sort
// in index order.
func TenantFormat(tenants int) string {
	return "fleet-%0" + strconv.Itoa(len(strconv.Itoa(max(tenants-1, 0)))) + "d"
}

// DomainID is the id of domain i (0-based) of n: "nvl72-0001" for the
// first of 1,400.
func DomainID(i, n int) string {
	return fmt.Sprintf("nvl72-%0*d", len(strconv.Itoa(n)), i+1)
}

// Write writes the topology and the config of s into dir (created if
// missing) and says what it wrote.
func Write(dir string, s Spec) (Files, error) {
	if err := s.Validate(); err != nil {
		return Files{}, err
	}
	if s.Model == "" {
		s.Model = "small"
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Files{}, fmt.Errorf("fleet directory: %w", err)
	}
	f := Files{
		Dir: dir, Topology: filepath.Join(dir, TopologyFile), Config: filepath.Join(dir, ConfigFile),
		Domains: s.Domains, GPUs: s.Domains * NVL72Trays * NVL72GPUsOnTray, Tenants: s.Tenants,
		TenantFormat: TenantFormat(s.Tenants),
	}
	f.TenantPool = fmt.Sprintf("%s:%d:%s", f.TenantFormat, s.Tenants, s.Model)
	if err := writeFile(f.Topology, func(w io.Writer) error { return WriteTopology(w, s.Domains) }); err != nil {
		return Files{}, err
	}
	if err := writeFile(f.Config, func(w io.Writer) error { return WriteConfig(w, s.Tenants) }); err != nil {
		return Files{}, err
	}
	return f, nil
}

// writeFile writes path through a buffer, whole or with an error naming it.
func writeFile(path string, write func(io.Writer) error) error {
	out, err := os.Create(path)
	if err != nil {
		return err // names the file
	}
	bw := bufio.NewWriterSize(out, 1<<16)
	err = errors.Join(write(bw), bw.Flush(), out.Close())
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// WriteTopology writes a cluster file of n GB200 NVL72 domains in the
// node-count shorthand: each 18 trays × 4 GPUs, trays named
// <domain>-tray01…18.
func WriteTopology(w io.Writer, n int) error {
	if n < 1 || n > MaxDomains {
		return fmt.Errorf("domains %d: want 1 to %d", n, MaxDomains)
	}
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "# %d GB200 NVL72 domains (sluicectl fleet generate): each one NVLink clique\n"+
		"# of %d compute trays × %d GPUs, %d GPUs in all.\ndomains:\n", n, NVL72Trays, NVL72GPUsOnTray, n*NVL72Trays*NVL72GPUsOnTray)
	for i := range n {
		id := DomainID(i, n)
		fmt.Fprintf(bw, "  - {id: %s, kind: nvl72, gpu: %s, nodes: %d, gpus_per_node: %d, node_prefix: %s-tray}\n",
			id, NVL72GPU, NVL72Trays, NVL72GPUsOnTray, id)
	}
	return bw.Flush()
}

// configHead is the config's part before its tenants: one tier whose
// quotas never bind (no RPS, token or concurrency limit reached, no floor,
// no budget, no burst credit), leases that outlive any run, and domain
// health that cuts a domain's weight on the first failed Release of a
// window and never restores it during a run, so that each cut `sluicectl
// load --churn` asks for is one placement change and nothing else changes
// placement behind its back.
const configHead = `# A fleet's config (sluicectl fleet generate): %d tenants on the tier
# "fleet", whose quotas never bind, so that every Admit is a full decision
# that admits at once. Domain health cuts a domain's weight on the first
# failed Release in a 1 s window and keeps it cut for the run (cooldown
# 1h): a failed Release is how a run changes a domain's health weight.
tiers:
  fleet:
    rps: {rate: 1e9, burst: 1e9}
    tokens: {rate: 1e12, burst: 1e12}
    weight: 1
leases: {ttl: 1h}
health:
  error_rate: 1e-6
  min_samples: 1
  window: 1s
  cooldown: 1h
tenants:
`

// WriteConfig writes a config of n tenants named by TenantFormat(n), all on
// the tier "fleet" (see configHead); the rest is the embedded default's.
func WriteConfig(w io.Writer, n int) error {
	if n < 1 || n > MaxTenants {
		return fmt.Errorf("tenants %d: want 1 to %d", n, MaxTenants)
	}
	bw := bufio.NewWriterSize(w, 1<<16)
	fmt.Fprintf(bw, configHead, n)
	prefix, width := "fleet-", len(strconv.Itoa(max(n-1, 0)))
	line := make([]byte, 0, 64)
	for i := range n {
		line = append(line[:0], "  "...)
		line = append(line, prefix...)
		line = appendPadded(line, i, width)
		line = append(line, ": {tier: fleet}\n"...)
		if _, err := bw.Write(line); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// appendPadded appends i in decimal, zero-padded to width digits.
func appendPadded(b []byte, i, width int) []byte {
	s := strconv.Itoa(i)
	for range width - len(s) {
		b = append(b, '0')
	}
	return append(b, s...)
}
