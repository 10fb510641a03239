package admission

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"sync"
	"testing"
	"time"
)

// TestConcurrentStress runs Admit, Release, caller cancellation, idempotent
// duplicates, Apply and Close concurrently with the dispatcher (meant for
// -race). Afterwards, with every lease released, nothing may be left
// charged: no KV, nothing in flight, nothing queued.
func TestConcurrentStress(t *testing.T) {
	cfg := testConfig()
	cfg.Queue.DefaultWait = Duration{50 * time.Millisecond}
	e, err := New(cfg, hgxCluster(t, 2))
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go e.Run(ctx)
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		leases = map[uint64]bool{} // every lease any answer named
	)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(int64(g)))
			for i := 0; i < 400; i++ {
				tenant, id := []string{"a", "b", "c"}[rng.Intn(3)], ""
				body := rng // a request id is a retry: the same body
				if rng.Intn(3) == 0 {
					n := rng.Intn(50)
					id = fmt.Sprintf("%s-%d", tenant, n)
					body = rand.New(rand.NewSource(int64(n)))
				}
				r := req(tenant, []string{"large", "medium", "small"}[body.Intn(3)], 4000, int64(1+body.Intn(200)))
				r.RequestID = id
				if r.Model != "small" && body.Intn(2) == 0 {
					r.AcceptDowngrade = []string{"small"}
				}
				c, cancel := context.WithTimeout(context.Background(), time.Duration(rng.Intn(30))*time.Millisecond)
				d, err := e.Admit(c, r)
				cancel()
				if errors.Is(err, ErrLeaseEnded) {
					continue // a retry of a request whose lease was released
				}
				if err != nil {
					t.Errorf("Admit(%+v): %v", r, err)
					return
				}
				if d.LeaseID != 0 {
					mu.Lock()
					leases[d.LeaseID] = true
					mu.Unlock()
					if rng.Intn(2) == 0 {
						_, _ = e.Release(context.Background(), Release{LeaseID: d.LeaseID, OutputTokens: 1})
					}
				}
				if g == 0 && i == 200 {
					if err := e.Apply(cfg); err != nil {
						t.Errorf("Apply: %v", err)
					}
				}
			}
		}(g)
	}
	wg.Wait()
	e.Close()
	for id := range leases {
		_, _ = e.Release(context.Background(), Release{LeaseID: id, OutputTokens: 1})
	}
	if n := e.LeaseCount(); n != 0 {
		t.Fatalf("%d leases held after releasing every lease any answer named", n)
	}
	for _, d := range e.Domains() {
		if d.KVInUse != 0 || d.InFlight != 0 {
			t.Errorf("domain %s: KV %d, in flight %d after everything was released", d.ID, d.KVInUse, d.InFlight)
		}
	}
	for _, ti := range e.Tenants() {
		if ti.Queued != 0 || ti.InFlight != 0 {
			t.Errorf("tenant %s: queued %d, in flight %d after Close and release", ti.Name, ti.Queued, ti.InFlight)
		}
	}
}
