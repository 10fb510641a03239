package nvml

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"

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
	// Discovered says the cluster was read through NVML, not from a file
	// or the simulated cluster (an auto fallback included).
	Discovered bool
	// node is NVML's discovery as read, before Merge judged its domain;
	// set where Discovered. A NodeLoader hands it on as it is.
	node *topology.NodeDiscovery
}

// Load resolves a --topology value (see the package documentation):
// "auto" (also ""), "auto:<file>", "nvml", "simulated" or a file path.
// NVML discovery runs on this node only, named by its host name, and the
// cluster is topology.Merge of that one discovery. An auto fallback is
// logged on log (nil: not logged) in one line. Errors begin with
// "topology" and name the setting or the file.
func Load(spec string, log *slog.Logger) (Loaded, error) {
	return load(spec, Discover, hostname(), fallbackLog(log, spec))
}

// discoverFunc is Discover's shape, so that tests can put a mock NVML
// behind load.
type discoverFunc func(node string) (topology.NodeDiscovery, error)

// load is the one resolution of a --topology value, Load's and
// NodeLoader's: it parses spec, discovers node through discover (Discover,
// or a test's mock NVML) where spec says, and falls back under auto when
// NVML is unavailable, calling fellBack (nil: nothing) with the fallback's
// source and the reason before it returns the fallback.
func load(spec string, discover discoverFunc, node string, fellBack func(source string, err error)) (Loaded, error) {
	switch {
	case isAuto(spec):
		fallback, err := autoFallback(spec)
		if err != nil {
			return Loaded{}, err
		}
		l, err := fromNVML(discover, node)
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
		if fellBack != nil {
			fellBack(l.Source, err)
		}
		l.Source = fmt.Sprintf("%s (%v)", l.Source, err)
		return l, nil
	case spec == SpecNVML:
		l, err := fromNVML(discover, node)
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

// isAuto says whether spec is "auto" (or empty, its default) or
// "auto:<file>".
func isAuto(spec string) bool {
	return spec == "" || spec == SpecAuto || strings.HasPrefix(spec, SpecAutoPrefix)
}

// autoFallback is what an auto spec falls back to: the simulated cluster
// for "auto", the file for "auto:<file>".
func autoFallback(spec string) (string, error) {
	if spec == "" || spec == SpecAuto {
		return SpecSimulated, nil
	}
	f := strings.TrimPrefix(spec, SpecAutoPrefix)
	if f == "" {
		return "", fmt.Errorf("topology %q: want a file path after %q", spec, SpecAutoPrefix)
	}
	return f, nil
}

// logFallback says in one line on log (nil: not at all) that auto fell
// back to source because of err: at Info where that is normal on a machine
// without GPUs (no cgo, no library), at Warn otherwise (driver not loaded,
// no permission), since a GPU host without a working driver deserves
// attention.
func logFallback(log *slog.Logger, spec, source string, err error) {
	if log == nil {
		return
	}
	level := slog.LevelWarn
	var ue *unavailableError
	if errors.As(err, &ue) && ue.expected {
		level = slog.LevelInfo
	}
	log.Log(context.Background(), level, "NVML unavailable; using the fallback topology",
		"topology", orAuto(spec), "fallback", source, "reason", err.Error())
}

// fallbackLog is load's fellBack hook that logs on log (logFallback).
func fallbackLog(log *slog.Logger, spec string) func(source string, err error) {
	return func(source string, err error) { logFallback(log, spec, source, err) }
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
	return Loaded{Cluster: c, Source: fmt.Sprintf("nvml (node %s)", node), Discovered: true, node: &nd}, nil
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

// orAuto names spec in messages: "auto" for the empty spec, which means
// it.
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

// NodeLoader resolves a --topology setting for one node, over and over: a
// node agent discovers at start, before each publication after a lost
// lease and at every rediscovery, so that a changed node is published as
// it is now. It resolves the setting as Load does (the same load), but
// gives the node's own discovery rather than a cluster: NVML's as read for
// "nvml" (and for auto where NVML is usable), else the node's entry in the
// simulated cluster or the file (Cluster.NodeDiscovery).
//
// Once NVML has answered, the loader does not fall back any more: NVML
// becoming unavailable later (driver unloaded, Init failing, GPUs gone)
// gives NVML's last discovery of the node with every GPU unhealthy, its
// Problem the reason, rather than the file's or the simulated cluster's
// healthy GPUs; under "nvml" too, rather than an error that would leave the
// last published node standing. That is logged at Warn, and an auto
// fallback as Load logs it, each once: again only when its reason changes
// or after NVML has answered in between. Safe for concurrent use; loads
// run one at a time.
type NodeLoader struct {
	spec, node string
	log        *slog.Logger
	discover   discoverFunc
	mu         struct {
		sync.Mutex
		// nvml is NVML's last discovery of the node; nil until NVML has
		// answered.
		nvml *topology.NodeDiscovery
		// logged is the fallback or NVML loss last logged; "" when none, or
		// when NVML has answered since.
		logged string
	}
}

// NewNodeLoader returns a NodeLoader of node (its name in the cluster) for
// spec ("auto", "auto:<file>", "nvml", "simulated" or a file path), logging
// on log (nil: not at all).
func NewNodeLoader(spec, node string, log *slog.Logger) *NodeLoader {
	return NewNodeLoaderWith(spec, node, log, Discover)
}

// NewNodeLoaderWith is NewNodeLoader discovering through discover (a node
// agent's tests put a fake NVML there) where it would call Discover.
func NewNodeLoaderWith(spec, node string, log *slog.Logger, discover func(node string) (topology.NodeDiscovery, error)) *NodeLoader {
	return &NodeLoader{spec: spec, node: node, log: log, discover: discover}
}

// Load discovers the node now. Its shape is that of the agent's Discover
// callback; ctx is not used (NVML discovery does not block on the network).
// Errors begin with "topology" and name the setting or the file.
func (l *NodeLoader) Load(context.Context) (topology.NodeDiscovery, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ld, err := load(l.spec, l.discoverLocked, l.node, l.fellBackLocked)
	if err != nil {
		return topology.NodeDiscovery{}, err
	}
	if ld.node != nil {
		return *ld.node, nil
	}
	nd, err := ld.Cluster.NodeDiscovery(l.node)
	if err != nil {
		return topology.NodeDiscovery{}, fmt.Errorf("topology %s: %w", ld.Source, err)
	}
	return nd, nil
}

// discoverLocked is l.discover remembering NVML's answer: after one, an
// unavailable NVML is the last answer with every GPU unhealthy (logged
// once per reason), not a reason for load to fall back.
func (l *NodeLoader) discoverLocked(node string) (topology.NodeDiscovery, error) {
	nd, err := l.discover(node)
	switch {
	case err == nil:
		last := nd
		last.GPUs = slices.Clone(nd.GPUs)
		l.mu.nvml, l.mu.logged = &last, ""
		return nd, nil
	case l.mu.nvml == nil:
		return nd, err
	}
	// NVML answered on this node before: whether it is gone or failing, its
	// GPUs cannot be vouched for. Report them unhealthy rather than keep a
	// healthy record published (or fall back to a file's).
	lost := *l.mu.nvml
	lost.GPUs = slices.Clone(lost.GPUs)
	for i := range lost.GPUs {
		lost.GPUs[i].Healthy, lost.GPUs[i].Problem = false, err.Error()
	}
	if l.newsLocked("lost\x00"+err.Error()) && l.log != nil {
		l.log.Warn("NVML stopped working; the node's GPUs are reported unhealthy, not taken from the fallback topology",
			"topology", orAuto(l.spec), "node", node, "gpus", len(lost.GPUs), "reason", err.Error())
	}
	return lost, nil
}

// fellBackLocked logs an auto fallback as Load does, unless it is the one
// last logged.
func (l *NodeLoader) fellBackLocked(source string, err error) {
	if l.newsLocked("fallback\x00" + source + "\x00" + err.Error()) {
		logFallback(l.log, l.spec, source, err)
	}
}

// newsLocked records what as the thing last logged and reports whether it
// differs from the one before, that is whether it is news to log.
func (l *NodeLoader) newsLocked(what string) bool {
	news := l.mu.logged != what
	l.mu.logged = what
	return news
}
