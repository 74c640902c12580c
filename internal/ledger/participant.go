package ledger

import (
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/reliable-mqtt/reliable-mqtt/internal/claims"
	"github.com/reliable-mqtt/reliable-mqtt/internal/commit"
)

// The participants below join the transaction of a writer on the ledger's
// file (the outbox), so that the processor never handles a *bolt.Tx.

// Participant records the claimed key in the writer's transaction (Apply).
func (c *Claim) Participant() commit.Participant {
	return commit.Participant{Path: c.l.Path(), Run: c.Apply}
}

// SkipParticipant stops a writer on the ledger's file from storing a
// message whose key is already applied with hash (SkipIfApplied).
func (l *Ledger) SkipParticipant(key claims.Key, hash [32]byte) commit.Participant {
	return commit.Participant{Path: l.Path(), Run: l.SkipIfApplied(key, hash)}
}

// RefuseParticipant makes a writer on the ledger's file refuse the message
// with cause, so a message the ledger could not check is never stored
// unchecked.
func (l *Ledger) RefuseParticipant(cause error) commit.Participant {
	return commit.Participant{Path: l.Path(), Run: func(*bolt.Tx) error {
		return fmt.Errorf("dedup_ledger failed for this message, so it is not stored: %w", cause)
	}}
}
