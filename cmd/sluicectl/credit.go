package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/controlplane"
)

// newCreditCmd is `sluicectl credit freeze|thaw`. With --etcd it writes (or
// deletes) the fleet's freeze key, with the end as an absolute time, and
// every replica applies it within one watch round-trip; without, it calls
// FreezeBurstCredit/ThawBurstCredit on the sluiced at --server, which writes
// the key itself when it follows etcd, else freezes only itself.
func newCreditCmd(g *globals) *cobra.Command {
	return group("credit", "Freeze every tenant's burst credit for a while (only in-quota requests pass), or thaw it",
		`With --etcd, freeze and thaw write the fleet's freeze key: every replica
applies it within one watch round-trip. Without, they call the sluiced at
--server, which writes the key itself when it follows etcd, else freezes only
itself.`,
		newCreditVerbCmd(g, true), newCreditVerbCmd(g, false))
}

// newCreditVerbCmd is `credit freeze` or, with freeze false, `credit thaw`.
func newCreditVerbCmd(g *globals, freeze bool) *cobra.Command {
	var (
		period     time.Duration
		reason, by string
		use, short = "thaw", "End a burst-credit freeze at once (says whether one was in force)"
		example    = "  sluicectl credit thaw --etcd http://etcd:2379"
		action     = "thaw"
	)
	if freeze {
		use, short, action = "freeze --for DURATION", "Freeze every tenant's burst credit for --for", "freeze"
		example = "  sluicectl credit freeze --for 5m --reason \"incident 42\" --etcd http://etcd:2379"
	}
	c := &cobra.Command{
		Use: use, Short: short, Example: example,
		Args: noArgs,
		RunE: func(*cobra.Command, []string) error {
			if freeze && (period <= 0 || period > 7*24*time.Hour) {
				return fmt.Errorf("--for %v: want a positive duration of at most 168h", period)
			}
			if by == "" {
				by = os.Getenv("USER")
			}
			res := creditResult{Action: action}
			var err error
			switch {
			case g.etcd.endpoints != "" && freeze:
				res.Where = "etcd"
				err = g.callEtcd(func(ctx context.Context, cli *clientv3.Client, prefix string) error {
					now := time.Now() // the operator's moment, not a decision: replicas compare the absolute end
					m := controlplane.CreditFreezeMark{Until: now.Add(period), Reason: reason, By: by, At: now}
					_, err := controlplane.PutCreditFreeze(ctx, cli, prefix, m)
					res.Frozen, res.Until, res.Reason = true, m.Until, m.Describe()
					return err
				})
			case g.etcd.endpoints != "":
				res.Where = "etcd"
				err = g.callEtcd(func(ctx context.Context, cli *clientv3.Client, prefix string) error {
					was, err := controlplane.DeleteCreditFreeze(ctx, cli, prefix)
					res.WasFrozen = &was
					return err
				})
			case freeze:
				res.Where = g.oneServer()
				err = g.call(res.Where, func(ctx context.Context, op admissionv1.OperatorClient) error {
					r, err := op.FreezeBurstCredit(ctx, &admissionv1.FreezeBurstCreditRequest{Duration: durationpb.New(period), Reason: reason})
					res.Frozen, res.Until, res.Reason = true, r.GetFreeze().GetUntil().AsTime(), r.GetFreeze().GetReason()
					return err
				})
			default:
				res.Where = g.oneServer()
				err = g.call(res.Where, func(ctx context.Context, op admissionv1.OperatorClient) error {
					r, err := op.ThawBurstCredit(ctx, &admissionv1.ThawBurstCreditRequest{})
					was := r.GetWasFrozen()
					res.WasFrozen = &was
					return err
				})
			}
			if err != nil {
				return err
			}
			return g.out().value(res, func(w io.Writer) error {
				_, err := fmt.Fprintln(w, res.sentence())
				return err
			})
		},
	}
	if freeze {
		c.Flags().DurationVar(&period, "for", 0, "how long to freeze burst credit (required; at most 168h)")
		c.Flags().StringVar(&reason, "reason", "", "why (shown by sluicectl domain list, config status and the audit log)")
		c.Flags().StringVar(&by, "by", "", "who freezes it, with --etcd (default $USER; over gRPC the server names the caller)")
	}
	return c
}

// creditResult is what a freeze or thaw did.
type creditResult struct {
	Action    string    `json:"action"` // freeze or thaw
	Frozen    bool      `json:"frozen,omitempty"`
	Until     time.Time `json:"until,omitzero"`
	Reason    string    `json:"reason,omitempty"`
	WasFrozen *bool     `json:"wasFrozen,omitempty"` // thaw: whether a freeze was in force
	Where     string    `json:"where"`               // "etcd" or the server's address
}

func (r creditResult) sentence() string {
	if r.Action == "freeze" {
		s := fmt.Sprintf("burst credit frozen until %s (for %s)", r.Until.UTC().Format(time.RFC3339), time.Until(r.Until).Round(time.Second))
		if r.Where == "etcd" {
			s += " on every replica (etcd)"
		} else {
			s += " by " + r.Where
		}
		if r.Reason != "" {
			s += ": " + r.Reason
		}
		return s
	}
	if r.WasFrozen == nil || !*r.WasFrozen {
		return "burst credit was not frozen (" + r.Where + ")"
	}
	return "burst credit thawed (" + r.Where + "): tenants borrow again"
}
