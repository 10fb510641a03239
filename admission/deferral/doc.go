// Package deferral is Sluice's backlog of deferrable work: requests that
// may wait minutes or hours (batch inference, evaluations, embeddings)
// and that, when they cannot run at once, are answered DEFERRED with a
// ticket instead of waiting in the in-memory queue or being refused.
package deferral
