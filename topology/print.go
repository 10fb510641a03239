package topology

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
)

// Output formats of Write.
const (
	FormatTable = "table"
	FormatJSON  = "json"
)

// Write prints a cluster for an operator (sluicectl topology, sluiced
// --print-topology) in format FormatTable or FormatJSON. source says where
// the cluster came from ("nvml", "simulated", a file path, with the reason
// for a fallback) and is printed first, because a simulated cluster on a
// GPU machine looks plausible and is wrong.
func Write(w io.Writer, c Cluster, source, format string) error {
	switch format {
	case FormatTable:
		return WriteTable(w, c, source)
	case FormatJSON:
		return WriteJSON(w, c, source)
	}
	return fmt.Errorf("topology: output format %q: want %s or %s", format, FormatTable, FormatJSON)
}

// Report is the JSON form of a printed cluster: the cluster with what an
// operator asks of it computed (healthy counts, the capacity-bearing peak
// totals, the source of every figure).
type Report struct {
	Source  string         `json:"source"`
	Domains []DomainReport `json:"domains"`
}

// DomainReport is one domain of a Report.
type DomainReport struct {
	ID          string       `json:"id"`
	Kind        string       `json:"kind"`
	GPUModel    string       `json:"gpuModel"`
	GPUs        int          `json:"gpus"`
	HealthyGPUs int          `json:"healthyGpus"`
	Peaks       PeaksReport  `json:"peaks"` // sum over healthy GPUs: what pd turns into capacity
	Nodes       []NodeReport `json:"nodes"`
}

// NodeReport is one node of a DomainReport.
type NodeReport struct {
	Name string      `json:"name"`
	GPUs []GPUReport `json:"gpus"`
}

// GPUReport is one GPU of a NodeReport. The NVML readings (memory, clocks,
// bus width) are 0 where they were not read.
type GPUReport struct {
	Index              int         `json:"index"`
	UUID               string      `json:"uuid"`
	Name               string      `json:"name"`
	PCIBusID           string      `json:"pciBusId"`
	MemoryBytes        int64       `json:"memoryBytes"`
	MaxSMClockMHz      int         `json:"maxSmClockMhz"`
	MaxMemClockMHz     int         `json:"maxMemClockMhz"`
	MemoryBusWidthBits int         `json:"memoryBusWidthBits"`
	ActiveNVLinks      int         `json:"activeNvlinks"`
	Healthy            bool        `json:"healthy"`
	Problem            string      `json:"problem,omitempty"`
	Peaks              PeaksReport `json:"peaks"`
}

// PeaksReport is Peaks with every figure's source spelled out.
type PeaksReport struct {
	SMs          int           `json:"sms"`
	FLOPS        float64       `json:"flops"`
	HBMBandwidth float64       `json:"hbmBandwidth"`
	HBMBytes     int64         `json:"hbmBytes"`
	Source       string        `json:"source"`
	Sources      SourcesReport `json:"sources"` // every figure's, resolved (FigureSources)
}

// SourcesReport is PeakSources in the report's JSON convention (the agent
// record in etcd keeps PeakSources' own).
type SourcesReport struct {
	SMs          string `json:"sms"`
	FLOPS        string `json:"flops"`
	HBMBandwidth string `json:"hbmBandwidth"`
	HBMBytes     string `json:"hbmBytes"`
}

// peaksReport renders peaks for the JSON report, with every figure's source
// resolved (FigureSources), so that a reader need not know that an empty
// figure source means the overall one.
func peaksReport(p Peaks) PeaksReport {
	return PeaksReport{
		SMs: p.SMs, FLOPS: p.FLOPS, HBMBandwidth: p.HBMBandwidth, HBMBytes: p.HBMBytes, Source: p.Source,
		Sources: SourcesReport(p.FigureSources()),
	}
}

// NewReport builds the Report of a cluster.
func NewReport(c Cluster, source string) Report {
	r := Report{Source: source, Domains: make([]DomainReport, 0, len(c.Domains))}
	for _, d := range c.Domains {
		dr := DomainReport{
			ID: d.ID, Kind: d.Kind, GPUModel: d.GPUModel(), GPUs: d.GPUCount(), HealthyGPUs: d.HealthyGPUCount(),
			Peaks: peaksReport(d.TotalPeaks()), Nodes: make([]NodeReport, 0, len(d.Nodes)),
		}
		for _, nd := range d.Nodes {
			nr := NodeReport{Name: nd.Name, GPUs: make([]GPUReport, 0, len(nd.GPUs))}
			for _, g := range nd.GPUs {
				nr.GPUs = append(nr.GPUs, GPUReport{
					Index: g.Index, UUID: g.UUID, Name: g.Name, PCIBusID: g.PCIBusID,
					MemoryBytes: g.MemoryBytes, MaxSMClockMHz: g.MaxSMClockMHz, MaxMemClockMHz: g.MaxMemClockMHz,
					MemoryBusWidthBits: g.MemoryBusWidthBits, ActiveNVLinks: g.ActiveNVLinks,
					Healthy: g.Healthy, Problem: g.Problem,
					Peaks: peaksReport(g.Peaks),
				})
			}
			dr.Nodes = append(dr.Nodes, nr)
		}
		r.Domains = append(r.Domains, dr)
	}
	return r
}

// WriteJSON prints the cluster's Report as indented JSON.
func WriteJSON(w io.Writer, c Cluster, source string) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(NewReport(c, source)); err != nil {
		return fmt.Errorf("topology: write json: %w", err)
	}
	return nil
}

// WriteTable prints the cluster as two tables: one line per domain (its
// healthy GPUs and the peak totals that become its capacity), then one line
// per GPU (identity, NVML's readings, active NVLinks, health and peaks with
// their sources). The readings are MEM (memory total, bytes), SM/MEM MHZ
// (the max SM and memory clocks) and BUS (memory bus width, bits); "-" where
// not read. Figures are in SI units: FLOP/s 2.25P is 2.25e15.
func WriteTable(w io.Writer, c Cluster, source string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "source: %s\n%d domains, %d GPUs\n\n", oneLine(source), len(c.Domains), c.GPUCount())
	fmt.Fprintln(tw, "DOMAIN\tKIND\tMODEL\tNODES\tGPUS\tHEALTHY\tSMS\tFLOP/S\tHBM B/S\tHBM B\tPEAKS")
	for _, d := range c.Domains {
		p := d.TotalPeaks()
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\n",
			oneLine(d.ID), oneLine(d.Kind), oneLine(d.GPUModel()), len(d.Nodes), d.GPUCount(), d.HealthyGPUCount(),
			p.SMs, si(p.FLOPS), si(p.HBMBandwidth), si(float64(p.HBMBytes)), sourcesText(p))
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "DOMAIN\tNODE\tGPU\tUUID\tNAME\tPCI BUS ID\tMEM\tSM/MEM MHZ\tBUS\tNVLINKS\tHEALTH\tSMS\tFLOP/S\tHBM B/S\tHBM B\tPEAKS")
	for _, d := range c.Domains {
		for _, nd := range d.Nodes {
			for _, g := range nd.GPUs {
				health := "ok"
				switch {
				case !g.Healthy && g.Problem != "":
					health = "unhealthy: " + g.Problem
				case !g.Healthy:
					health = "unhealthy"
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%d\t%s\t%s\t%s\t%s\n",
					oneLine(d.ID), oneLine(nd.Name), g.Index, orDash(g.UUID), oneLine(g.Name), orDash(g.PCIBusID),
					siOrDash(float64(g.MemoryBytes)), clocksText(g), intOrDash(g.MemoryBusWidthBits),
					g.ActiveNVLinks, oneLine(health), g.Peaks.SMs, si(g.Peaks.FLOPS), si(g.Peaks.HBMBandwidth),
					si(float64(g.Peaks.HBMBytes)), sourcesText(g.Peaks))
			}
		}
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("topology: write table: %w", err)
	}
	return nil
}

// sourcesText is the peaks' source, or each figure's where they differ.
func sourcesText(p Peaks) string {
	f := p.FigureSources()
	if f.SMs == f.FLOPS && f.FLOPS == f.HBMBandwidth && f.HBMBandwidth == f.HBMBytes {
		return orDash(f.SMs)
	}
	return fmt.Sprintf("sms=%s flops=%s bw=%s hbm=%s", orDash(f.SMs), orDash(f.FLOPS), orDash(f.HBMBandwidth), orDash(f.HBMBytes))
}

// si writes v with an SI prefix and four significant digits: 2.25P, 141G.
func si(v float64) string {
	if v == 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return fmt.Sprint(v)
	}
	const prefixes = "kMGTPEZY"
	unit := ""
	for i := 0; math.Abs(v) >= 1000 && i < len(prefixes); i++ {
		v /= 1000
		unit = prefixes[i : i+1]
	}
	return fmt.Sprintf("%.4g%s", v, unit)
}

// oneLine keeps a name from breaking the table: names come from NVML and
// files, and a tab or newline in one would shift every column after it.
func oneLine(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '\t' || r == '\n' || r == '\r' {
			return ' '
		}
		return r
	}, s)
}

// clocksText is a GPU's max SM and memory clocks as "SM/MEM", each "-"
// where not read.
func clocksText(g GPU) string {
	return intOrDash(g.MaxSMClockMHz) + "/" + intOrDash(g.MaxMemClockMHz)
}

// intOrDash writes n, or "-" for 0 (not read).
func intOrDash(n int) string {
	if n == 0 {
		return "-"
	}
	return fmt.Sprint(n)
}

// siOrDash writes v as si does, or "-" for 0 (not read).
func siOrDash(v float64) string {
	if v == 0 {
		return "-"
	}
	return si(v)
}

// orDash writes s on one line, or "-" for an empty s, so that an empty
// field (a GPU from a file has no UUID) keeps its table column.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return oneLine(s)
}
