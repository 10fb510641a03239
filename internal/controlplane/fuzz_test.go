package controlplane

import (
	"testing"

	"github.com/sluice-sched/sluice/internal/config"
)

// Whatever is written to etcd, decoding it never panics: a config document
// is parsed or refused, an agent record or a drain mark decoded or skipped.
func FuzzDocuments(f *testing.F) {
	base, tenants, err := split(config.DefaultYAML())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(base, tenants["acme"], []byte(`{"node":"n","gpus":[{"index":0,"name":"H200","healthy":true,"peaks":{"sms":1,"flops":1,"hbm_bandwidth":1,"hbm_bytes":1}}]}`))
	f.Add([]byte("tiers: {a: {weight: 1e400}}"), []byte("tier: [\n"), []byte(`{"node":"n","gpus":[]}`))
	f.Add([]byte("null"), []byte("null"), []byte("null"))
	f.Fuzz(func(t *testing.T, base, tenant, agent []byte) {
		_, _ = ParseDocuments("/p/", base, map[string][]byte{"t": tenant})
		_, _ = decodeAgent("n", agent)
		_, _ = decodeDrain("d", agent)
	})
}
