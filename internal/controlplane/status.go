package controlplane

import (
	"errors"
	"sync"
	"time"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/internal/config"
)

// Config sources as Status reports them (besides a file path).
const (
	SourceEmbedded = "embedded"
	SourceEtcd     = "etcd"
)

// RefusalOf describes err, a refusal of the config from source; a
// *config.Error gives its file (the etcd key, for etcd documents), key and
// reason.
func RefusalOf(source string, rev int64, at time.Time, err error) admission.ConfigRefusal {
	r := admission.ConfigRefusal{Source: source, Reason: err.Error(), Revision: rev, At: at}
	var ce *config.Error
	if errors.As(err, &ce) {
		r.Source, r.Key, r.Reason = ce.File, ce.Key, ce.Reason
		if r.Source == "" {
			r.Source = source
		}
	}
	return r
}

// StatusView is a snapshot of a Status.
type StatusView struct {
	Source      string // SourceEmbedded, a file path or SourceEtcd
	Revision    int64  // etcd revision of the serving config; 0 when not from etcd
	AppliedAt   time.Time
	LastRefusal *admission.ConfigRefusal // the latest refusal since the serving config was applied
	// Connected is whether etcd is reachable; true when not using etcd.
	Connected bool
	// DisconnectedSince is when etcd became unreachable; zero while connected.
	DisconnectedSince time.Time
}

// Status records which config serves, where it came from, the last refusal
// and whether the control plane is reachable. Both the file reloads of
// sluiced and the etcd watcher feed it; the Operator's GetConfigStatus and
// the health endpoint read it. It is safe for concurrent use.
type Status struct {
	metrics *Metrics
	mu      struct {
		sync.Mutex
		v StatusView
	}
}

// NewStatus returns a Status for a config applied from source at at.
// metrics may be nil.
func NewStatus(source string, at time.Time, metrics *Metrics) *Status {
	s := &Status{metrics: metrics}
	s.mu.v = StatusView{Source: source, AppliedAt: at, Connected: true}
	metrics.setConnected(true)
	return s
}

// Applied records that the config from source (at etcd revision rev, 0 for
// a file) now serves; it clears the last refusal.
func (s *Status) Applied(source string, rev int64, at time.Time) {
	s.mu.Lock()
	s.mu.v.Source, s.mu.v.Revision, s.mu.v.AppliedAt, s.mu.v.LastRefusal = source, rev, at, nil
	s.mu.Unlock()
	s.metrics.applied(rev)
}

// Refused records a refusal; the serving config is unchanged.
func (s *Status) Refused(r admission.ConfigRefusal) {
	s.mu.Lock()
	s.mu.v.LastRefusal = &r
	s.mu.Unlock()
	kind := "file"
	if r.Revision != 0 { // only etcd writes have a revision
		kind = SourceEtcd
	}
	s.metrics.refused(kind)
}

// SetConnected records whether etcd is reachable and reports whether that
// changed.
func (s *Status) SetConnected(ok bool, at time.Time) bool {
	s.mu.Lock()
	changed := s.mu.v.Connected != ok
	s.mu.v.Connected = ok
	if changed && !ok {
		s.mu.v.DisconnectedSince = at
	} else if ok {
		s.mu.v.DisconnectedSince = time.Time{}
	}
	s.mu.Unlock()
	s.metrics.setConnected(ok)
	return changed
}

// View returns a snapshot.
func (s *Status) View() StatusView {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.mu.v
	if v.LastRefusal != nil {
		r := *v.LastRefusal
		v.LastRefusal = &r
	}
	return v
}
