package topology

import (
	_ "embed"
	"fmt"
	"sync"
)

//go:embed simulated.yaml
var simulatedYAML []byte

var simulated = sync.OnceValue(func() Cluster {
	c, err := Parse(simulatedYAML)
	if err != nil { // the embedded file is tested; this is a build defect
		panic(fmt.Sprintf("topology: simulated.yaml: %v", err))
	}
	return c
})

// Simulated returns the embedded default cluster, written in the file format
// in simulated.yaml: two GB200 NVL72 racks, domains "nvl72-a" and "nvl72-b"
// (kind "nvl72", 18 trays × 4 GPUs, nodes "nvl72-a-tray01" …), and four HGX
// H200 servers, domains "hgx-h200-1" … "hgx-h200-4" (kind "hgx", one node
// named as its domain, 8 GPUs). GPUs carry deterministic fake UUIDs. Each
// call returns a fresh copy the caller may change.
func Simulated() Cluster {
	return simulated().Clone()
}
