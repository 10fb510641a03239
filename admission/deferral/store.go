package deferral

import (
	"context"
	"errors"
	"time"
)

// State is where a ticket stands.
type State int32

// Ticket states. The numeric values match admission/v1's TicketState.
const (
	StatePending   State = 1 // in the backlog, waiting for capacity and a worker
	StateClaimed   State = 2 // admitted and handed to a worker; its lease is live
	StateDone      State = 3 // the worker released its lease
	StateExpired   State = 4 // defer_within passed before it was admitted
	StateCancelled State = 5 // the submitter cancelled it before it was claimed
)

// String returns the state's API name.
func (s State) String() string {
	switch s {
	case StatePending:
		return "PENDING"
	case StateClaimed:
		return "CLAIMED"
	case StateDone:
		return "DONE"
	case StateExpired:
		return "EXPIRED"
	case StateCancelled:
		return "CANCELLED"
	}
	return "UNKNOWN"
}

// Final reports whether the ticket has left the backlog for good.
func (s State) Final() bool { return s >= StateDone }

// Finishes reports whether a ticket in state s moves to the final state
// to (Store.Finish): a final ticket keeps its first final state, and a
// claimed one is not cancelled (its worker runs it).
func (s State) Finishes(to State) bool {
	return !s.Final() && !(to == StateCancelled && s == StateClaimed)
}

// ClaimedWith reports whether the ticket is claimed with the lease
// (Store.Unclaim puts back only that claim).
func (r *Record) ClaimedWith(leaseID uint64) bool {
	return r.State == StateClaimed && r.Claim.LeaseID == leaseID
}

// Work is the request a ticket stands for, as the submitter sent it.
type Work struct {
	RequestID            string   `json:"request_id,omitempty"`
	Tenant               string   `json:"tenant"`
	Model                string   `json:"model"`
	PromptTokens         int64    `json:"prompt_tokens"`
	MaxOutputTokens      int64    `json:"max_output_tokens"`
	Priority             int32    `json:"priority,omitempty"`
	AcceptDowngrade      []string `json:"accept_downgrade,omitempty"`
	ExpectedCachedTokens int64    `json:"expected_cached_tokens,omitempty"`
}

// Claim is what a ticket's admission granted: the lease a worker settles
// with Release, where and on what it runs, and when it was granted.
type Claim struct {
	LeaseID uint64    `json:"lease_id"`
	Domain  string    `json:"domain"`
	Model   string    `json:"model"`
	At      time.Time `json:"at"`
	// Expires is when the lease ends unless released: a ticket claimed
	// then is redelivered (a worker that died holding it).
	Expires time.Time `json:"expires"`
}

// Record is one ticket as the store keeps it.
type Record struct {
	ID      string    `json:"id"`
	Seq     uint64    `json:"seq"` // submission order of the tenant's tickets (a sharded store orders other tenants' only roughly)
	Work    Work      `json:"work"`
	Created time.Time `json:"created"`
	// Deadline is Created + defer_within: a ticket still pending then
	// expires.
	Deadline time.Time `json:"deadline"`
	State    State     `json:"state"`
	Claim    Claim     `json:"claim,omitzero"`
	Reason   string    `json:"reason,omitempty"` // why it expired or was cancelled
	Finished time.Time `json:"finished,omitzero"`
}

// ErrNotFound is returned for a ticket the store does not hold.
var ErrNotFound = errors.New("deferral: ticket not found")

// Store keeps tickets durably: a ticket the backlog answered DEFERRED is
// in the store before the answer leaves, and every change of state is
// written before the backlog acts on it, so that a restart on the same
// store admits each ticket exactly once or expires it with its reason.
//
// The backlog serialises calls for one ticket; calls for different
// tickets may run concurrently, and an implementation should group
// concurrent writes into one commit (a burst of thousands of deferrals
// must not cost thousands of fsyncs). Final records are kept for a
// retention period so that GetTicket can still answer, then dropped.
type Store interface {
	// Add writes a new pending ticket. Its Seq is assigned by the store
	// and returned; an Add repeated with the same id returns the first's
	// Seq and writes nothing (a retry makes no second ticket).
	Add(ctx context.Context, rec Record) (seq uint64, err error)
	// Claim marks a pending ticket claimed with c. A ticket that is no
	// longer pending (cancelled meanwhile, say through another replica)
	// returns its current record and ok false: the caller undoes its
	// admission. On success cur is the claimed record.
	Claim(ctx context.Context, id string, c Claim) (cur Record, ok bool, err error)
	// Unclaim puts a ticket claimed with leaseID back to pending: that
	// lease ended without a Release, or the ticket could not be handed to
	// a worker. On a ticket that is not claimed, or claimed with another
	// lease (by a replica that adopted it meanwhile), it does nothing.
	Unclaim(ctx context.Context, id string, leaseID uint64) error
	// Finish moves a ticket to a final state (done, expired, cancelled)
	// with a reason, at time at; it leaves the backlog. A ticket already
	// final keeps its first final state, and a claimed one is not
	// cancelled (its worker runs it: StateCancelled ends only a pending
	// ticket); a state that is not final is an error.
	Finish(ctx context.Context, id string, state State, reason string, at time.Time) error
	// Get returns one ticket, final ones while retained.
	Get(ctx context.Context, id string) (Record, error)
	// Adopt returns the unfinished tickets (pending or claimed) that are
	// now this backlog's to admit and that it does not hold yet, in Seq
	// order within each tenant. The backlog calls it at start and every
	// adopt interval. An embedded store returns, on the first call, every
	// unfinished ticket it did not take through Add since it was opened (a
	// restart takes its backlog back), and nothing after (the backlog
	// skips any it holds already);
	// a store shared by replicas returns, besides, the tickets of replicas
	// that stopped (their holds lapsed), each to one adopter.
	Adopt(ctx context.Context) ([]Record, error)
	// Close releases the store's resources.
	Close() error
}
