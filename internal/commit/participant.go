// Package commit carries, in a message's context, the work that must be
// committed together with that message's effect.
//
// A Participant is a piece of state (a dedup ledger entry) that must become
// durable in the same bbolt transaction as something another component
// writes to the same file (the outbox append). The writer runs the
// participants bound to its file inside its transaction; it knows nothing
// about what they write, and they know nothing about MQTT.
package commit

import (
	"context"
	"errors"

	bolt "go.etcd.io/bbolt"
)

// ErrAlreadyApplied, returned by a Participant, means the effect it guards
// has already been committed: the writer must write nothing for this message
// and report success.
var ErrAlreadyApplied = errors.New("commit: effect already applied")

// Participant joins the transaction of the component that writes the bbolt
// file at Path (an absolute, cleaned path).
type Participant struct {
	Path string
	// Run is called inside the writer's read-write transaction, before its
	// own write. It must not keep tx. An error rolls back only this
	// message's share of the transaction (the writer redoes the others).
	// Run may use tx.OnCommit to learn that its writes became durable.
	Run func(tx *bolt.Tx) error
}

type participantsKey struct{}

// WithParticipant returns a context that carries p in addition to the
// participants ctx already carries.
func WithParticipant(ctx context.Context, p Participant) context.Context {
	prev, _ := ctx.Value(participantsKey{}).([]Participant)
	next := make([]Participant, 0, len(prev)+1)
	next = append(append(next, prev...), p)
	return context.WithValue(ctx, participantsKey{}, next)
}

// ParticipantsFor returns the participants in ctx bound to the file at path.
func ParticipantsFor(ctx context.Context, path string) []func(tx *bolt.Tx) error {
	all, _ := ctx.Value(participantsKey{}).([]Participant)
	var out []func(tx *bolt.Tx) error
	for _, p := range all {
		if p.Path == path {
			out = append(out, p.Run)
		}
	}
	return out
}
