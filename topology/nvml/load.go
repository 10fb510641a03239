package nvml

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/sluice-sched/sluice/topology"
)

// Values of the --topology setting other than a file path.
const (
	SpecAuto      = "auto"      // NVML, else the simulated cluster
	SpecNVML      = "nvml"      // NVML or an error
	SpecSimulated = "simulated" // topology.Simulated
	// SpecAutoPrefix followed by a path: NVML, else that file.
	SpecAutoPrefix = "auto:"
)

// ErrUnavailable is the cause of every discovery failure that means "this
// machine has no usable NVML": built without cgo, library not found, Init
// failed, no GPU. Under auto, Load falls back on it; anything else is an
// error.
var ErrUnavailable = errors.New("NVML unavailable")

// unavailableError is an ErrUnavailable with its reason. expected marks
// the reasons normal on a machine without GPUs (no cgo, no library), which
// are logged at Info rather than Warn.
type unavailableError struct {
	reason   string
	expected bool
}

func (e *unavailableError) Error() string        { return ErrUnavailable.Error() + ": " + e.reason }
func (e *unavailableError) Is(target error) bool { return target == ErrUnavailable }

// Loaded is a cluster and where it came from.
type Loaded struct {
	Cluster topology.Cluster
	// Source names the cluster's origin for logs and printouts: "nvml
	// (node h1)", "simulated", or a file path; after an auto fallback it
	// ends with the reason, e.g. "simulated (NVML unavailable: built
	// without cgo)".
	Source string
}

// Load resolves a --topology value (see the package documentation):
// "auto" (also ""), "auto:<file>", "nvml", "simulated" or a file path.
// NVML discovery runs on this node only, named by its host name, and the
// cluster is topology.Merge of that one discovery. An auto fallback is
// logged on log (nil: not logged) in one line. Errors begin with
// "topology" and name the setting or the file.
func Load(spec string, log *slog.Logger) (Loaded, error) {
	return load(spec, log, Discover, hostname)
}

// discoverFunc is Discover's shape, so that tests can put a mock NVML
// behind load.
type discoverFunc func(node string) (topology.NodeDiscovery, error)

func load(spec string, log *slog.Logger, discover discoverFunc, node func() string) (Loaded, error) {
	switch {
	case spec == "" || spec == SpecAuto || strings.HasPrefix(spec, SpecAutoPrefix):
		fallback := SpecSimulated
		if spec != "" && spec != SpecAuto {
			fallback = strings.TrimPrefix(spec, SpecAutoPrefix)
			if fallback == "" {
				return Loaded{}, fmt.Errorf("topology %q: want a file path after %q", spec, SpecAutoPrefix)
			}
		}
		l, err := fromNVML(discover, node())
		if err == nil {
			return l, nil
		}
		if !errors.Is(err, ErrUnavailable) {
			return Loaded{}, fmt.Errorf("topology %s: %w", orAuto(spec), err)
		}
		l, ferr := fromSpec(fallback)
		if ferr != nil {
			return Loaded{}, fmt.Errorf("topology %s: %v; fallback: %w", orAuto(spec), err, ferr)
		}
		if log != nil {
			level := slog.LevelWarn
			var ue *unavailableError
			if errors.As(err, &ue) && ue.expected {
				level = slog.LevelInfo
			}
			log.Log(context.Background(), level, "NVML unavailable; using the fallback topology", "topology", orAuto(spec), "fallback", l.Source, "reason", err.Error())
		}
		l.Source = fmt.Sprintf("%s (%v)", l.Source, err)
		return l, nil
	case spec == SpecNVML:
		l, err := fromNVML(discover, node())
		if err != nil {
			return Loaded{}, fmt.Errorf("topology nvml: %w", err)
		}
		return l, nil
	}
	l, err := fromSpec(spec)
	if err != nil {
		return Loaded{}, fmt.Errorf("topology: %w", err)
	}
	return l, nil
}

// fromNVML discovers this node and merges it into a cluster of its own.
func fromNVML(discover discoverFunc, node string) (Loaded, error) {
	nd, err := discover(node)
	if err != nil {
		return Loaded{}, err
	}
	c, err := topology.Merge([]topology.NodeDiscovery{nd})
	if err != nil {
		return Loaded{}, err
	}
	return Loaded{Cluster: c, Source: fmt.Sprintf("nvml (node %s)", node)}, nil
}

// fromSpec loads the simulated cluster or a file.
func fromSpec(spec string) (Loaded, error) {
	if spec == SpecSimulated {
		return Loaded{Cluster: topology.Simulated(), Source: SpecSimulated}, nil
	}
	c, err := topology.LoadFile(spec)
	if err != nil {
		return Loaded{}, err // LoadFile names the file
	}
	return Loaded{Cluster: c, Source: spec}, nil
}

func orAuto(spec string) string {
	if spec == "" {
		return SpecAuto
	}
	return spec
}

// hostname names this node; a node that cannot name itself is "localhost",
// which is still unique in the one-node cluster Load builds.
func hostname() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "localhost"
	}
	return h
}
