package main

import (
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
)

func init() {
	register(command{
		name:    "tenants",
		summary: "list tenants: tier, weight, token level, queue, leases, breaker, spend (sorted, paginated)",
		run:     runTenants,
	})
	register(command{
		name:    "tenant",
		summary: "one tenant: gates, bucket levels, burst credit, queue, leases, spend",
		run:     runTenant,
	})
}

// tenantSorts are the orders `tenants --sort` knows, each with its key;
// the numeric ones put the largest first (the tenants an SRE looks for).
var tenantSorts = map[string]func(a, b *admissionv1.TenantInfo) int{
	"name":      func(a, b *admissionv1.TenantInfo) int { return cmp.Compare(a.GetName(), b.GetName()) },
	"tier":      func(a, b *admissionv1.TenantInfo) int { return cmp.Compare(a.GetTier(), b.GetTier()) },
	"weight":    func(a, b *admissionv1.TenantInfo) int { return cmp.Compare(b.GetWeight(), a.GetWeight()) },
	"queued":    func(a, b *admissionv1.TenantInfo) int { return cmp.Compare(b.GetQueued(), a.GetQueued()) },
	"in-flight": func(a, b *admissionv1.TenantInfo) int { return cmp.Compare(b.GetInFlight(), a.GetInFlight()) },
	"spend": func(a, b *admissionv1.TenantInfo) int {
		return cmp.Compare(b.GetSpentTodayMicros(), a.GetSpentTodayMicros())
	},
	// level: the emptiest bucket first (as a share of its burst), where
	// refusals come from.
	"level": func(a, b *admissionv1.TenantInfo) int { return cmp.Compare(levelShare(a), levelShare(b)) },
}

// levelShare is the token bucket level as a share of its burst.
func levelShare(t *admissionv1.TenantInfo) float64 {
	if t.GetTokenBurst() <= 0 {
		return 0
	}
	return float64(t.GetTokenLevel()) / float64(t.GetTokenBurst())
}

// tenantPage is what `tenants -o json` prints: one page and where it is.
type tenantPage struct {
	Total    int `json:"total"` // tenants matching --match
	Page     int `json:"page"`
	Pages    int `json:"pages"`
	PageSize int `json:"page_size"`
	// Tenants are rendered as the gRPC messages' JSON (protojson), the
	// field names grpcurl shows.
	Tenants []json.RawMessage `json:"tenants"`
}

// runTenants lists a server's tenants, sorted and paginated here: it reads
// every page of the Operator API's ListTenants (in name order) and cuts
// its own pages in the order asked for.
func runTenants(args []string, out, errw io.Writer) error {
	fs := flag.NewFlagSet("sluicectl tenants", flag.ContinueOnError)
	fs.SetOutput(errw)
	var of operatorFlags
	of.register(fs)
	format := fs.String("o", "table", "output format: table or json")
	sortBy := fs.String("sort", "name", "order: name, tier, weight, queued, in-flight, spend (largest first) or level (emptiest token bucket first)")
	match := fs.String("match", "", "only tenants whose name contains this")
	pageSize := fs.Int("page-size", 50, "tenants per page (0: all)")
	page := fs.Int("page", 1, "which page, from 1")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	if err := checkFormat(*format); err != nil {
		return err
	}
	less, ok := tenantSorts[*sortBy]
	if !ok {
		return fmt.Errorf("--sort %q: want one of %s", *sortBy, strings.Join(sortedKeys(tenantSorts), ", "))
	}
	if *pageSize < 0 || *page < 1 {
		return fmt.Errorf("--page-size %d --page %d: want a size ≥ 0 and a page ≥ 1", *pageSize, *page)
	}
	// Every page of ListTenants (the server pages in name order), then
	// filtered, sorted and cut into this command's own pages.
	var all []*admissionv1.TenantInfo
	err := of.call(func(ctx context.Context, op admissionv1.OperatorClient) error {
		for token := ""; ; {
			resp, err := op.ListTenants(ctx, &admissionv1.ListTenantsRequest{PageToken: token})
			if err != nil {
				return err
			}
			all = append(all, resp.GetTenants()...)
			if token = resp.GetNextPageToken(); token == "" {
				return nil
			}
		}
	})
	if err != nil {
		return err
	}
	ts := slices.DeleteFunc(all, func(t *admissionv1.TenantInfo) bool { return !strings.Contains(t.GetName(), *match) })
	slices.SortStableFunc(ts, func(a, b *admissionv1.TenantInfo) int {
		if c := less(a, b); c != 0 {
			return c
		}
		return cmp.Compare(a.GetName(), b.GetName())
	})
	size := *pageSize
	if size == 0 {
		size = max(len(ts), 1)
	}
	pages := max((len(ts)+size-1)/size, 1)
	lo := min((*page-1)*size, len(ts))
	hi := min(lo+size, len(ts))
	shown := ts[lo:hi]
	if *format == "json" {
		p := tenantPage{Total: len(ts), Page: *page, Pages: pages, PageSize: size, Tenants: make([]json.RawMessage, len(shown))}
		for i, t := range shown {
			b, err := protojson.Marshal(t)
			if err != nil {
				return fmt.Errorf("render %s: %w", t.GetName(), err)
			}
			p.Tenants[i] = b
		}
		return writeJSON(out, p)
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tTIER\tWEIGHT\tFLOOR\tTOKENS (LEVEL/BURST)\tDEBT\tQUEUED\tIN FLIGHT\tBREAKER\tSPENT TODAY")
	for _, t := range shown {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d/%d\t%d\t%d\t%d\t%s\t%s\n", t.GetName(), t.GetTier(), t.GetWeight(), t.GetFloorTokens(),
			t.GetTokenLevel(), t.GetTokenBurst(), max(0, -t.GetTokenLevel()), t.GetQueued(), t.GetInFlight(), breakerCell(t), usd(t.GetSpentTodayMicros()))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if pages > 1 {
		next := ""
		if *page < pages {
			next = fmt.Sprintf("; --page %d for the next", *page+1)
		}
		fmt.Fprintf(errw, "page %d of %d (%d tenants, %d a page)%s\n", *page, pages, len(ts), size, next)
	}
	return nil
}

// runTenant describes one tenant: its gates (tier, weight, floor, breaker),
// bucket levels, burst credit, queue, leases and spend.
func runTenant(args []string, out, errw io.Writer) error {
	fs := flag.NewFlagSet("sluicectl tenant", flag.ContinueOnError)
	fs.SetOutput(errw)
	var of operatorFlags
	of.register(fs)
	format := fs.String("o", "table", "output format: table or json")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("usage: sluicectl tenant NAME [flags]")
	}
	if err := checkFormat(*format); err != nil {
		return err
	}
	var resp *admissionv1.GetTenantResponse
	err = of.call(func(ctx context.Context, op admissionv1.OperatorClient) (err error) {
		resp, err = op.GetTenant(ctx, &admissionv1.GetTenantRequest{Name: pos[0]})
		return err
	})
	if err != nil {
		return err
	}
	t := resp.GetTenant()
	if *format == "json" {
		return writeProto(out, t)
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	row := func(k, format string, a ...any) { fmt.Fprintf(tw, "%s\t"+format+"\n", append([]any{k}, a...)...) }
	row("tenant:", "%s", t.GetName())
	row("tier:", "%s (weight %d in the fair queue)", t.GetTier(), t.GetWeight())
	row("floor:", "%d weighted tokens/s guaranteed", t.GetFloorTokens())
	row("token bucket:", "%d of %d (rate %d/s)", t.GetTokenLevel(), t.GetTokenBurst(), t.GetTokenRate())
	row("burst credit:", "%d owed of %d", max(0, -t.GetTokenLevel()), t.GetCredit())
	row("breaker:", "%s", breakerCell(t))
	row("rps bucket:", "%d requests", t.GetRpsLevel())
	row("queued:", "%d", t.GetQueued())
	row("leases:", "%d in flight", t.GetInFlight())
	row("spent:", "%s today, %s this month (UTC)", usd(t.GetSpentTodayMicros()), usd(t.GetSpentMonthMicros()))
	return tw.Flush()
}

// breakerCell renders the burst-credit breaker.
func breakerCell(t *admissionv1.TenantInfo) string {
	if !t.GetBreakerOpen() {
		return "closed"
	}
	if t.GetBreakerUntil() != nil {
		return "OPEN until " + t.GetBreakerUntil().AsTime().UTC().Format(time.RFC3339)
	}
	return "OPEN"
}

// usd renders micro-USD.
func usd(micros int64) string { return fmt.Sprintf("$%.2f", float64(micros)/1e6) }

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
