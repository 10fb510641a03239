package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
)

// newTenantCmd is `sluicectl tenant list|get`. tenant itself takes a
// NAME, as `tenant get NAME` does, so that `sluicectl tenant acme` goes on
// working.
func newTenantCmd(g *globals) *cobra.Command {
	c := newTenantGetCmd(g)
	c.Use = "tenant [NAME]"
	c.Short = "List tenants, or show one"
	c.Long = `List tenants (tenant list), or show one (tenant get NAME, or tenant NAME).
Also: sluicectl tenants for tenant list.`
	c.Example = `  sluicectl tenant list --server sluiced:7070 --sort queued
  sluicectl tenant get acme --server sluiced:7070`
	get := c.RunE
	c.Args = cobra.ArbitraryArgs
	c.RunE = func(c *cobra.Command, a []string) error {
		if len(a) != 1 {
			return usagef("want a command (%s) or one tenant NAME", strings.Join(verbNames(c), ", "))
		}
		return get(c, a)
	}
	c.AddCommand(newTenantListCmd(g), newTenantGetCmd(g))
	return c
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

// tenantPage is what `tenant list -o json` prints: one page and where it is.
type tenantPage struct {
	Total    int `json:"total"` // tenants matching --match
	Page     int `json:"page"`
	Pages    int `json:"pages"`
	PageSize int `json:"pageSize"`
	// Tenants are rendered as the gRPC messages' JSON (protojson), the
	// field names and numbers grpcurl shows.
	Tenants []json.RawMessage `json:"tenants"`
}

// newTenantListCmd is `tenant list` (also `tenants`): a server's tenants,
// sorted and paginated here: it reads every page of the Operator API's
// ListTenants (in name order) and cuts its own pages in the order asked
// for.
func newTenantListCmd(g *globals) *cobra.Command {
	var (
		sortBy, match  string
		pageSize, page int
	)
	c := &cobra.Command{
		Use:   "list",
		Short: "List tenants: tier, weight, token level, queue, leases, breaker, spend (sorted, paginated)",
		Long: `List a server's tenants: tier, weight, floor, token bucket level, debt,
queue, leases, breaker and spend, sorted (numbers largest first; level the
emptiest token bucket first), filtered by name, one page at a time (the page
and how to get the next on stderr). Also: sluicectl tenants.`,
		Example: `  sluicectl tenant list --server sluiced:7070 --sort level --page-size 20`,
		Args:    noArgs,
		RunE: func(*cobra.Command, []string) error {
			return listTenants(g, sortBy, match, pageSize, page)
		},
	}
	c.Flags().StringVar(&sortBy, "sort", "name", "order: name, tier, weight, queued, in-flight, spend (largest first) or level (emptiest token bucket first)")
	c.Flags().StringVar(&match, "match", "", "only tenants whose name contains this")
	c.Flags().IntVar(&pageSize, "page-size", 50, "tenants per page (0: all)")
	c.Flags().IntVar(&page, "page", 1, "which page, from 1")
	_ = c.RegisterFlagCompletionFunc("sort", func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return sortedKeys(tenantSorts), cobra.ShellCompDirectiveNoFileComp
	})
	return c
}

// listTenants runs tenant list.
func listTenants(g *globals, sortBy, match string, pageSize, page int) error {
	errw := g.stderr
	less, ok := tenantSorts[sortBy]
	if !ok {
		return fmt.Errorf("--sort %q: want one of %s", sortBy, strings.Join(sortedKeys(tenantSorts), ", "))
	}
	if pageSize < 0 || page < 1 {
		return fmt.Errorf("--page-size %d --page %d: want a size ≥ 0 and a page ≥ 1", pageSize, page)
	}
	// Every page of ListTenants (the server pages in name order), then
	// filtered, sorted and cut into this command's own pages.
	var all []*admissionv1.TenantInfo
	err := g.call(g.oneServer(), func(ctx context.Context, op admissionv1.OperatorClient) error {
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
	ts := slices.DeleteFunc(all, func(t *admissionv1.TenantInfo) bool { return !strings.Contains(t.GetName(), match) })
	slices.SortStableFunc(ts, func(a, b *admissionv1.TenantInfo) int {
		if c := less(a, b); c != 0 {
			return c
		}
		return cmp.Compare(a.GetName(), b.GetName())
	})
	size := pageSize
	if size == 0 {
		size = max(len(ts), 1)
	}
	pages := max((len(ts)+size-1)/size, 1)
	lo := min((page-1)*size, len(ts))
	hi := min(lo+size, len(ts))
	shown := ts[lo:hi]
	p := tenantPage{Total: len(ts), Page: page, Pages: pages, PageSize: size, Tenants: make([]json.RawMessage, len(shown))}
	for i, t := range shown {
		b, err := protoJSON(t)
		if err != nil {
			return fmt.Errorf("tenant %s: %w", t.GetName(), err)
		}
		p.Tenants[i] = b
	}
	if err := g.out().value(p, func(w io.Writer) error { return writeTenants(w, shown) }); err != nil {
		return err
	}
	if pages > 1 {
		next := ""
		if page < pages {
			next = fmt.Sprintf("; --page %d for the next", page+1)
		}
		fmt.Fprintf(errw, "page %d of %d (%d tenants, %d a page)%s\n", page, pages, len(ts), size, next)
	}
	return nil
}

// writeTenants prints a page of tenants as a table.
func writeTenants(out io.Writer, shown []*admissionv1.TenantInfo) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tTIER\tWEIGHT\tFLOOR\tTOKENS (LEVEL/BURST)\tDEBT\tQUEUED\tIN FLIGHT\tBREAKER\tSPENT TODAY")
	for _, t := range shown {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d/%d\t%d\t%d\t%d\t%s\t%s\n", t.GetName(), t.GetTier(), t.GetWeight(), t.GetFloorTokens(),
			t.GetTokenLevel(), t.GetTokenBurst(), max(0, -t.GetTokenLevel()), t.GetQueued(), t.GetInFlight(), breakerCell(t), usd(t.GetSpentTodayMicros()))
	}
	return tw.Flush()
}

// newTenantGetCmd is `tenant get NAME`: its gates (tier, weight, floor,
// breaker), bucket levels, burst credit, queue, leases and spend.
func newTenantGetCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "get NAME",
		Short:   "One tenant: gates, bucket levels, burst credit, queue, leases, spend",
		Example: `  sluicectl tenant get acme --server sluiced:7070 -o json`,
		Args:    args(1, 1, "one tenant NAME"),
		RunE:    func(_ *cobra.Command, a []string) error { return getTenant(g, a[0]) },
	}
}

// getTenant runs tenant get.
func getTenant(g *globals, name string) error {
	var resp *admissionv1.GetTenantResponse
	err := g.call(g.oneServer(), func(ctx context.Context, op admissionv1.OperatorClient) (err error) {
		resp, err = op.GetTenant(ctx, &admissionv1.GetTenantRequest{Name: name})
		return err
	})
	if err != nil {
		return err
	}
	t := resp.GetTenant()
	return g.out().message(t, func(w io.Writer) error { return writeTenant(w, t) })
}

// writeTenant prints one tenant for people.
func writeTenant(out io.Writer, t *admissionv1.TenantInfo) error {
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
