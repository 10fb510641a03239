package openai

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/internal/gateway"
)

// The benchmarks' requests name the small model, whose domain admits
// thousands a second: the measure is the front's own cost, not the
// capacity Sluice models.
const (
	benchWhole  = `{"model":"small","max_tokens":16,"messages":[{"role":"user","content":"tell me a story"}]}`
	benchStream = `{"model":"small","stream":true,"max_tokens":16,"messages":[{"role":"user","content":"tell me a story"}]}`
)

// benchTargets are the front and a bare httputil.ReverseProxy (the same
// transport, flushing alike) to the same engine, for the pair of numbers
// docs/performance.md compares.
func benchTargets(b *testing.B) map[string]string {
	r := newRig(b, Options{})
	engineURL, err := url.Parse("http://" + r.engineAddr)
	if err != nil {
		b.Fatal(err)
	}
	bare := httptest.NewServer(&httputil.ReverseProxy{
		Rewrite:       func(pr *httputil.ProxyRequest) { pr.SetURL(engineURL) },
		Transport:     NewTransport(),
		FlushInterval: -1,
	})
	b.Cleanup(bare.Close)
	return map[string]string{"front": r.url, "bare": bare.URL}
}

// BenchmarkThroughput is requests/s of whole chat completions, many
// clients at once, through the front and through the bare proxy.
//
//	go test ./internal/openai -run '^$' -bench 'Throughput|FirstByte' -benchtime 20000x
func BenchmarkThroughput(b *testing.B) {
	targets := benchTargets(b)
	for _, name := range []string{"bare", "front"} {
		b.Run(name, func(b *testing.B) {
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024}}
			b.SetParallelism(8)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					req, _ := http.NewRequest("POST", targets[name]+PathChat, strings.NewReader(benchWhole))
					req.Header.Set(gateway.DefaultTenantHeader, "acme")
					resp, err := client.Do(req)
					if err != nil {
						b.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						b.Errorf("status %d", resp.StatusCode)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
		})
	}
}

// BenchmarkFirstByte is the time from a streamed request's send to the
// first byte of its answer, one request at a time: p50 and p99 through the
// front and through the bare proxy.
func BenchmarkFirstByte(b *testing.B) {
	targets := benchTargets(b)
	for _, name := range []string{"bare", "front"} {
		b.Run(name, func(b *testing.B) {
			client := &http.Client{Transport: &http.Transport{}}
			lat := make([]time.Duration, 0, b.N)
			buf := make([]byte, 1)
			for b.Loop() {
				req, _ := http.NewRequestWithContext(context.Background(), "POST", targets[name]+PathChat, strings.NewReader(benchStream))
				req.Header.Set(gateway.DefaultTenantHeader, "acme")
				start := time.Now()
				resp, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(resp.Body, buf); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		})
	}
}
