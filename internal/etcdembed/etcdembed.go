// Package etcdembed starts an etcd server in the calling process with
// go.etcd.io/etcd/server/v3/embed: one member, a given data directory and
// URLs, a silent logger, and no metrics listener beyond the client port's
// /metrics. The drills' self-contained fleet (internal/drill) and the
// tests' etcd (internal/controlplane/etcdtest) start theirs with it; no
// product package embeds etcd.
package etcdembed

import (
	"fmt"
	"net/url"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Options say where a server keeps its data and listens.
type Options struct {
	// Name is the member's name.
	Name string
	// Dir is the data directory; a start on the same one finds the same
	// data.
	Dir string
	// Listen is the client URL the server listens on.
	Listen url.URL
	// Advertise is the client URL the server tells its clients; Listen
	// when empty.
	Advertise url.URL
	// Peer is the peer URL, listened on and advertised.
	Peer url.URL
	// Ready bounds the wait for the server to be ready to serve.
	Ready time.Duration
}

// Start starts a server and waits until it is ready, has failed, or
// o.Ready has passed; on a failure the server is closed.
func Start(o Options) (*embed.Etcd, error) {
	advertise := o.Advertise
	if advertise == (url.URL{}) {
		advertise = o.Listen
	}
	cfg := embed.NewConfig()
	cfg.Name = o.Name
	cfg.Dir = o.Dir
	cfg.ListenClientUrls = []url.URL{o.Listen}
	cfg.AdvertiseClientUrls = []url.URL{advertise}
	cfg.ListenPeerUrls = []url.URL{o.Peer}
	cfg.AdvertisePeerUrls = []url.URL{o.Peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	// etcd serves its own /metrics on the client port; nothing else.
	cfg.ListenMetricsUrls = nil
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("start etcd in %s: %w", o.Dir, err)
	}
	select {
	case <-e.Server.ReadyNotify():
		return e, nil
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("start etcd: %w", err)
	case <-time.After(o.Ready):
		e.Close()
		return nil, fmt.Errorf("start etcd: not ready after %v", o.Ready)
	}
}
