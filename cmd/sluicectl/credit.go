package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/controlplane"
)

func init() {
	register(command{
		name:    "credit",
		summary: "freeze every tenant's burst credit for a while (only in-quota requests pass), or thaw it: credit freeze --for 5m | credit thaw",
		run:     runCredit,
	})
}

// runCredit is `sluicectl credit freeze|thaw`. With --etcd it writes (or
// deletes) the fleet's freeze key, with the end as an absolute time, and
// every replica applies it within one watch round-trip; without, it calls
// FreezeBurstCredit/ThawBurstCredit on the sluiced at --server, which writes
// the key itself when it follows etcd, else freezes only itself.
func runCredit(args []string, out, _ io.Writer) error {
	const usage = "usage: sluicectl credit freeze --for DURATION [--reason TEXT] | sluicectl credit thaw"
	if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
		fmt.Fprintln(out, usage) // then freeze's flags, a superset of thaw's
		args = []string{"freeze", "-h"}
	}
	if len(args) == 0 || (args[0] != "freeze" && args[0] != "thaw") {
		return errors.New(usage)
	}
	freeze := args[0] == "freeze"
	fs := flag.NewFlagSet("sluicectl credit "+args[0], flag.ContinueOnError)
	fs.SetOutput(out)
	var ef etcdFlags
	ef.register(fs)
	var sf serverFlags
	sf.register(fs)
	server := fs.String("server", "localhost:7070", "without --etcd: the sluiced to call (it writes the freeze to etcd itself when it follows etcd)")
	format := fs.String("o", "table", "output format: table (a sentence) or json")
	var period *time.Duration
	var reason, by *string
	if freeze {
		period = fs.Duration("for", 0, "how long to freeze burst credit (required; at most 168h)")
		reason = fs.String("reason", "", "why (shown by sluicectl domains, config status and the audit log)")
		by = fs.String("by", os.Getenv("USER"), "who freezes it, with --etcd (default $USER; over gRPC the server names the caller)")
	}
	if err := parseNoArgs(fs, args[1:]); err != nil {
		return err
	}
	if err := checkFormat(*format); err != nil {
		return err
	}
	if freeze && (*period <= 0 || *period > 7*24*time.Hour) {
		return fmt.Errorf("--for %v: want a positive duration of at most 168h", *period)
	}
	var res creditResult
	var err error
	switch {
	case ef.endpoints != "" && freeze:
		err = ef.call(func(ctx context.Context, cli *clientv3.Client, prefix string) error {
			now := time.Now() // the operator's moment, not a decision: replicas compare the absolute end
			m := controlplane.CreditFreezeMark{Until: now.Add(*period), Reason: *reason, By: *by, At: now}
			_, err := controlplane.PutCreditFreeze(ctx, cli, prefix, m)
			res = creditResult{Action: "freeze", Frozen: true, Until: m.Until, Reason: m.Describe(), Where: "etcd"}
			return err
		})
	case ef.endpoints != "":
		err = ef.call(func(ctx context.Context, cli *clientv3.Client, prefix string) error {
			was, err := controlplane.DeleteCreditFreeze(ctx, cli, prefix)
			res = creditResult{Action: "thaw", WasFrozen: was, Where: "etcd"}
			return err
		})
	case freeze:
		of := operatorFlags{server: *server, timeout: ef.timeout, serverFlags: sf}
		err = of.call(func(ctx context.Context, op admissionv1.OperatorClient) error {
			r, err := op.FreezeBurstCredit(ctx, &admissionv1.FreezeBurstCreditRequest{Duration: durationpb.New(*period), Reason: *reason})
			res = creditResult{Action: "freeze", Frozen: true, Until: r.GetFreeze().GetUntil().AsTime(), Reason: r.GetFreeze().GetReason(), Where: *server}
			return err
		})
	default:
		of := operatorFlags{server: *server, timeout: ef.timeout, serverFlags: sf}
		err = of.call(func(ctx context.Context, op admissionv1.OperatorClient) error {
			r, err := op.ThawBurstCredit(ctx, &admissionv1.ThawBurstCreditRequest{})
			res = creditResult{Action: "thaw", WasFrozen: r.GetWasFrozen(), Where: *server}
			return err
		})
	}
	if err != nil {
		return err
	}
	if *format == "json" {
		return writeJSON(out, res)
	}
	fmt.Fprintln(out, res.sentence())
	return nil
}

// creditResult is what a freeze or thaw did, for -o json and the sentence.
type creditResult struct {
	Action    string    `json:"action"` // freeze or thaw
	Frozen    bool      `json:"frozen,omitempty"`
	Until     time.Time `json:"until,omitzero"`
	Reason    string    `json:"reason,omitempty"`
	WasFrozen bool      `json:"was_frozen,omitempty"`
	Where     string    `json:"where"` // "etcd" or the server's address
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
	if !r.WasFrozen {
		return "burst credit was not frozen (" + r.Where + ")"
	}
	return "burst credit thawed (" + r.Where + "): tenants borrow again"
}
