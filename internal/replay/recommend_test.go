package replay

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// syntheticRows is a tenant's seeded trace: Poisson arrivals at perSec
// requests a second for span, perSec×burstX in each burst window of 20 s,
// prompts of 500–1500 tokens and outputs of 50–150 on model.
func syntheticRows(seed uint64, tenant, model string, perSec, burstX float64, span time.Duration, bursts ...time.Duration) []Row {
	rng := rand.New(rand.NewPCG(seed, 1))
	var rows []Row
	for at := time.Duration(0); ; {
		rate := perSec
		for _, b := range bursts {
			if at >= b && at < b+20*time.Second {
				rate *= burstX
			}
		}
		at += time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
		if at >= span {
			return rows
		}
		rows = append(rows, Row{At: at, Tenant: tenant, Model: model, Prompt: 500 + rng.Int64N(1001), Output: 50 + rng.Int64N(101), Line: len(rows) + 2})
	}
}

// merge interleaves tenants' rows in arrival order.
func merge(parts ...[]Row) []Row {
	var rows []Row
	for _, p := range parts {
		rows = append(rows, p...)
	}
	slices.SortStableFunc(rows, func(a, b Row) int { return cmpInt64(int64(a.At), int64(b.At)) })
	return rows
}

// The search finds the edge: the proposed rate meets the target in its own
// replay, and a rate 20% lower (with the burst that goes with it) does not.
func TestRecommendSearchFindsTheEdge(t *testing.T) {
	cfg, cl := setup(t)
	rows := syntheticRows(7, "initech", "medium", 1, 8, 10*time.Minute, 200*time.Second, 400*time.Second)
	o := CheckOptions{Config: cfg, Cluster: cl, Window: 5 * time.Second, Target: time.Second}
	p, err := RecommendChecked(rows, o)
	if err != nil {
		t.Fatal(err)
	}
	r := p.Tenants[0]
	if !r.TargetMet || len(r.Search) > MaxSearchReplays || p.Replays != len(r.Search)+1 {
		t.Fatalf("met %v after %d search replays (at most %d), %d in all", r.TargetMet, len(r.Search), MaxSearchReplays, p.Replays)
	}
	alone := func(rate int64) Wait {
		w, err := quotaReplay(rows, &o, map[string]quota{"initech": {rate, r.burstAt(rate)}})
		if err != nil {
			t.Fatal(err)
		}
		return w["initech"]
	}
	if w := alone(r.Rate); !w.Meets(1000) || w.P99Ms != r.Alone.P99Ms {
		t.Errorf("at R = %d: p99 %s ms, want ≤ 1000 ms and the search's %s", r.Rate, w, r.Alone)
	}
	lower := r.Rate * 8 / 10
	if w := alone(lower); w.Meets(1000) {
		t.Errorf("at 0.8 R = %d: p99 %s ms meets the target: the search stopped short of the edge", lower, w)
	}
	if r.Rate <= int64(r.MeanRate) || r.Burst != r.burstAt(r.Rate) || r.Burst < r.LargestReq {
		t.Errorf("R %d (mean %.0f), C %d (largest request %d)", r.Rate, r.MeanRate, r.Burst, r.LargestReq)
	}
	t.Logf("R %d C %d p99 %s ms, %d replays", r.Rate, r.Burst, r.Alone, p.Replays)
}

// The check flags a sum of rates above the cluster's soft capacity, with
// the replay at rates scaled to it, and a rate below the tenant's floor.
func TestRecommendCheckFlagsCapacityAndFloors(t *testing.T) {
	cfg, cl := setup(t)
	rows := merge(
		syntheticRows(1, "acme", "large", 4, 6, 5*time.Minute, 60*time.Second, 200*time.Second),
		syntheticRows(2, "initech", "large", 4, 6, 5*time.Minute, 100*time.Second, 240*time.Second),
		syntheticRows(3, "globex", "small", 0.05, 1, 5*time.Minute),
	)
	p, err := RecommendChecked(rows, CheckOptions{Config: cfg, Cluster: cl, Window: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := p.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	c := p.Capacity
	if !(c.Load > 1) || c.Domains != 4 || c.Bound != "prefill" || len(p.Scaled) != 3 {
		t.Fatalf("capacity %+v, %d scaled:\n%s", c, len(p.Scaled), b.String())
	}
	if got := float64(c.SumOfRates) / c.Capacity; got < c.Load*0.999 || got > c.Load*1.001 {
		t.Errorf("sum %d / capacity %.0f = %.3f, want the load %.3f", c.SumOfRates, c.Capacity, got, c.Load)
	}
	for _, want := range []string{fmt.Sprintf("is %.2f× the cluster's soft capacity", c.Load), "rates scaled to capacity", "globex: rate", "below its floor 2000"} {
		if !strings.Contains(strings.Join(p.Flags, "\n"), want) {
			t.Errorf("no flag says %q:\n%s", want, strings.Join(p.Flags, "\n"))
		}
	}
	for i, s := range p.Scaled {
		r := p.Tenants[i]
		if want := max(int64(math.Ceil(float64(r.Rate)/c.Load)), r.Floor); s.Rate != want {
			t.Errorf("%s scaled to %d from %d at load %.2f, want %d", s.Tenant, s.Rate, r.Rate, c.Load, want)
		}
	}
	t.Logf("\n%s", b.String())
}

// The replay together reports each tenant's p99 beside its target.
func TestRecommendTogetherReportsEachTenant(t *testing.T) {
	cfg, cl := setup(t)
	rows := merge(
		syntheticRows(4, "globex", "medium", 1, 6, 5*time.Minute, 60*time.Second),
		syntheticRows(5, "hooli", "small", 1, 6, 5*time.Minute, 150*time.Second),
	)
	p, err := RecommendChecked(rows, CheckOptions{Config: cfg, Cluster: cl, Window: 5 * time.Second, Target: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Together) != 2 {
		t.Fatalf("%d tenants together", len(p.Together))
	}
	for i, tr := range p.Together {
		r := p.Tenants[i]
		if tr.Tenant != r.Tenant || tr.Rate != max(r.Rate, r.Floor) || tr.Met == nil || *tr.Met != tr.Wait.Meets(2000) ||
			tr.Wait.Requests != r.Requests || tr.Alone == nil || tr.Alone.P99Ms != r.Alone.P99Ms {
			t.Errorf("together %+v for %s (rate %d, %d requests)", tr, r.Tenant, r.Rate, r.Requests)
		}
	}
	var b bytes.Buffer
	if err := p.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"p99 together ms", "globex ", "hooli ", "rate search"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
	var j bytes.Buffer
	if err := p.WriteJSON(&j); err != nil || !strings.Contains(j.String(), `"together"`) {
		t.Errorf("json: %v\n%s", err, j.String())
	}
	// The same input gives the same plan.
	q, err := RecommendChecked(rows, CheckOptions{Config: cfg, Cluster: cl, Window: 5 * time.Second, Target: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var k bytes.Buffer
	_ = q.WriteJSON(&k)
	if !bytes.Equal(j.Bytes(), k.Bytes()) {
		t.Error("two plans of the same input differ")
	}
	t.Logf("\n%s", b.String())
}
