package main

import (
	"context"
	"fmt"
	"io"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-sched/sluice/admission/client"
	"github.com/sluice-sched/sluice/admission/client/etcdmembers"
	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
)

// replicaView is one replica's answer to ListDomains, or why there is none.
type replicaView struct {
	client.Member
	domains []*admissionv1.DomainInfo
	freeze  *admissionv1.CreditFreeze // the replica's credit freeze; nil when none
	err     error
}

// listDomains asks the sluiced at addr for its domains and its credit freeze.
func listDomains(ctx context.Context, addr string, sec client.Security) (*admissionv1.ListDomainsResponse, error) {
	conn, err := dialServer(addr, sec)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	resp, err := admissionv1.NewOperatorClient(conn).ListDomains(ctx, &admissionv1.ListDomainsRequest{})
	if err != nil {
		return nil, serverErr(addr, err)
	}
	return resp, nil
}

// fleetViews asks every replica registered under prefix for its domains, all
// at once, each dialled with sec. A replica that does not answer has its error in its view. A
// member entry that is not a member is skipped, with a warning on errw.
func fleetViews(ctx context.Context, cli *clientv3.Client, prefix string, sec client.Security, errw io.Writer) ([]replicaView, error) {
	members, bad, err := etcdmembers.List(ctx, cli, prefix)
	if err != nil {
		return nil, err
	}
	for _, err := range bad {
		fmt.Fprintf(errw, "sluicectl: warning: skipping a registered replica: %v\n", err)
	}
	views := make([]replicaView, len(members))
	var wg sync.WaitGroup
	for i, m := range members {
		views[i].Member = m
		wg.Go(func() {
			resp, err := listDomains(ctx, m.Addr, sec)
			views[i].domains, views[i].freeze, views[i].err = resp.GetDomains(), resp.GetCreditFreeze(), err
		})
	}
	wg.Wait()
	return views, nil
}
