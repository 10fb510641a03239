package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/load"
)

// openAIFlags are load's flags for an OpenAI-compatible endpoint.
type openAIFlags struct {
	url, header, floors string
	outputWeight        int64
}

// register adds the flags to c.
func (f *openAIFlags) register(c *cobra.Command) {
	fs := c.Flags()
	fs.StringVar(&f.url, "openai", "", "send --trace as streamed chat completions over HTTP to this OpenAI base URL (e.g. http://127.0.0.1:8080/v1) instead of gRPC Admits")
	fs.StringVar(&f.header, "tenant-header", load.DefaultTenantHeader, "with --openai: the header naming each request's tenant")
	fs.StringVar(&f.floors, "floors", "", "with --openai: tenant:floor,… in weighted tokens/s, for the floor-violation seconds (default: read from --server's tenants when --server is given)")
	fs.Int64Var(&f.outputWeight, "output-weight", 4, "with --openai: an output token's weight in the admitted work (the config's output_token_weight)")
}

// unused refuses the flags when --openai is not given.
func (f *openAIFlags) unused(set func(string) bool) error {
	for _, n := range []string{"tenant-header", "floors", "output-weight"} {
		if set(n) {
			return fmt.Errorf("--%s is for --openai", n)
		}
	}
	return nil
}

// parseFloors reads tenant:floor,…
func parseFloors(s string) (map[string]int64, error) {
	out := map[string]int64{}
	for _, part := range strings.Split(s, ",") {
		name, v, ok := strings.Cut(strings.TrimSpace(part), ":")
		n, err := strconv.ParseInt(v, 10, 64)
		if !ok || name == "" || err != nil || n < 0 {
			return nil, fmt.Errorf("--floors %q: want tenant:floor,… with floors ≥ 0 (weighted tokens/s)", part)
		}
		out[name] = n
	}
	return out, nil
}

// runLoadOpenAI runs load --openai: the trace's arrivals as HTTP chat
// completions, streamed.
func runLoadOpenAI(g *globals, c *cobra.Command, lf *loadFlags) error {
	set := func(name string) bool { return c.Flags().Changed(name) }
	if lf.trace.path == "" {
		return errors.New("--openai sends a trace's arrivals: it needs --trace")
	}
	for _, f := range []string{"rate", "concurrency", "tenants", "tenant-pool", "tenant-order", "prompt", "output", "arrivals", "accept-downgrade",
		"hold", "release", "request-ids", "conns", "reference", "rounds", "server-pid", "prefill", "churn", "churn-rate"} {
		if set(f) {
			return fmt.Errorf("--%s is for the gRPC load, not --openai", f)
		}
	}
	if lf.maxInFlight < 1 {
		return fmt.Errorf("--max-in-flight %d: want at least 1", lf.maxInFlight)
	}
	if lf.openai.outputWeight < 1 {
		return fmt.Errorf("--output-weight %d: want at least 1", lf.openai.outputWeight)
	}
	if !strings.HasPrefix(lf.openai.url, "http://") && !strings.HasPrefix(lf.openai.url, "https://") {
		return fmt.Errorf("--openai %q: want an http:// or https:// base URL", lf.openai.url)
	}
	rows, err := lf.trace.load()
	if err != nil {
		return err
	}
	opts := load.OpenAIOptions{BaseURL: lf.openai.url, TenantHeader: lf.openai.header, MaxInFlight: lf.maxInFlight,
		OutputWeight: lf.openai.outputWeight, Client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024}}}
	if lf.deadline < 0 {
		return fmt.Errorf("--deadline %v: want ≥ 0", lf.deadline)
	}
	opts.Deadline = lf.deadline
	if set("duration") {
		opts.Duration = lf.duration
	}
	for _, r := range rows {
		opts.Arrivals = append(opts.Arrivals, load.Arrival{At: r.At, Tenant: r.Tenant, Model: r.Model, Prompt: r.Prompt, Output: r.Output})
	}
	switch {
	case lf.openai.floors != "":
		if opts.Floors, err = parseFloors(lf.openai.floors); err != nil {
			return err
		}
	case g.server != "":
		if opts.Floors, err = serverFloors(g); err != nil {
			return err
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	res, err := load.RunOpenAI(ctx, opts)
	if err != nil {
		return err
	}
	return g.out().value(res, func(w io.Writer) error { return load.WriteOpenAI(w, res) })
}

// serverFloors reads every tenant's floor from the server's tenants API.
func serverFloors(g *globals) (map[string]int64, error) {
	floors := map[string]int64{}
	err := g.call(g.oneServer(), func(ctx context.Context, op admissionv1.OperatorClient) error {
		for token := ""; ; {
			resp, err := op.ListTenants(ctx, &admissionv1.ListTenantsRequest{PageToken: token})
			if err != nil {
				return err
			}
			for _, t := range resp.GetTenants() {
				floors[t.GetName()] = t.GetFloorTokens()
			}
			if token = resp.GetNextPageToken(); token == "" {
				return nil
			}
		}
	})
	if err != nil {
		return nil, fmt.Errorf("reading the tenants' floors from %s: %w", g.oneServer(), err)
	}
	return floors, nil
}
