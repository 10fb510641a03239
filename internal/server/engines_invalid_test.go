package server

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-sched/sluice/internal/enginemetrics"
)

// An engine whose reading holds a value that is no reading is counted in
// sluice_engine_readings_invalid_total by reason, each reason exported
// from the start; the honest engine beside it describes the domain.
func TestInvalidEngineReadingsAreCounted(t *testing.T) {
	serve := func(waiting string) *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			_, _ = w.Write([]byte("# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting " + waiting + "\n# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc 0.3\n"))
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	honest, negative := serve("50"), serve("-1000")
	f, err := newEngineFeed(EngineMetricsOptions{Period: 10 * time.Second}, nil, time.Now, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.reader.SetDomains(map[string][]enginemetrics.Endpoint{"d1": {
		{URL: honest.URL + "/metrics", Kind: "vllm"}, {URL: negative.URL + "/metrics", Kind: "vllm"},
	}}); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	f.register(reg)
	f.reader.Poll(context.Background())
	f.reader.Poll(context.Background())

	if s, ok := f.reader.Signal("d1"); !ok || s.Queue != 50 || s.Failed != 1 {
		t.Errorf("d1 = %+v (%v), want the honest engine's 50 with the other failed", s, ok)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range families {
		if mf.GetName() != "sluice_engine_readings_invalid_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" {
					got[l.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	want := map[string]float64{"negative": 2, "nan": 0, "infinite": 0, "too_large": 0}
	for reason, n := range want {
		if v, ok := got[reason]; !ok || v != n {
			t.Errorf("sluice_engine_readings_invalid_total{reason=%q} = %v (exported %v), want %v", reason, v, ok, n)
		}
	}
	if len(got) != len(want) {
		t.Errorf("reasons exported %v, want %v", got, want)
	}
}
