// Package dedup is what dedup_ledger decides for one message copy, over
// either store: the bbolt ledger (internal/ledger) or an SQL table
// (internal/sqlledger). A copy of a key that is not applied is claimed and
// passes; its claim is committed when the message's effect commits (or at
// once, with Immediate) and released when the message fails, so the next
// copy passes again. It knows nothing of Benthos: plugin/ledger evaluates
// keys and maps each Decision onto its message.
//
// Invariant, enforced in Check: a key is recorded only under its claim, and
// a claim is recorded only after the message's effect committed (or, with
// Immediate, before the output runs, which the user chose).
package dedup

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/claims"
	"github.com/reliable-mqtt/reliable-mqtt/internal/commit"
)

// NewKey checks an evaluated key. An empty key, or "null" — what a missing
// metadata key interpolates to — is an error: accepting it would
// deduplicate every keyless message under one key.
func NewKey(namespace, id string) (claims.Key, error) {
	if id == "" || id == "null" {
		return claims.Key{}, fmt.Errorf("dedup_ledger: the key evaluated to %q: the message has no event key (is the metadata or field the key names missing?); it is not deduplicated and fails", id)
	}
	if namespace == "null" {
		return claims.Key{}, fmt.Errorf("dedup_ledger: the namespace of key %q evaluated to \"null\" (is the field it names missing?); the message fails", id)
	}
	return claims.Key{Namespace: namespace, ID: id}, nil
}

// Hash is what the ledger stores of a payload, to tell a duplicate from a
// conflict.
func Hash(payload []byte) [32]byte { return sha256.Sum256(payload) }

// Counter is a metric counter (Benthos's *service.MetricCounter is one).
type Counter interface {
	Incr(n int64, labelValues ...string)
}

// Gate checks copies against one store. Its fields are set once, before
// the first Check.
type Gate struct {
	Store     Store
	Wait      time.Duration // how long a copy waits for another copy in flight
	Immediate bool          // commit: immediate — record the key before the output runs

	Passed, Commits, Releases Counter
	OnCommit                  func() // after this gate recorded a key (may be nil)
}

// Decision is the fate of one copy.
type Decision struct {
	Verdict claims.Verdict // Pass, Duplicate or Conflict; meaningless with Err
	Err     error          // the copy could not be checked or passed: it fails
	// Join, if not nil, goes with the message into the transaction of a
	// writer on the ledger's file (bbolt): it records a passed key with the
	// record, and keeps a duplicate or a failed copy out of that file.
	Join *commit.Participant
}

// Batch checks the copies of one batch. Copies of a key inside one batch
// share its fate: the batch is acknowledged or retried as one, so waiting
// for an earlier copy's claim would wait for ourselves.
type Batch struct {
	g      *Gate
	passed map[claims.Key][32]byte
}

// Batch starts checking one batch.
func (g *Gate) Batch() *Batch { return &Batch{g: g, passed: map[claims.Key][32]byte{}} }

// Fail is the decision for a copy that could not be checked (err).
func (g *Gate) Fail(err error) Decision { return Decision{Err: err, Join: g.Store.Refuse(err)} }

// Check decides for one copy of key whose payload hashes to hash. hooks
// are the message's delivery hooks (nil if its input has none).
func (b *Batch) Check(ctx context.Context, key claims.Key, hash [32]byte, hooks *commit.Hooks) Decision {
	g := b.g
	if earlier, ok := b.passed[key]; ok {
		if earlier != hash {
			return Decision{Verdict: claims.Conflict}
		}
		return Decision{Verdict: claims.Duplicate, Join: g.Store.Skip(key, hash)}
	}
	c, v, err := g.Store.Claim(ctx, key, hash, g.Wait)
	switch {
	case err != nil:
		return g.Fail(err)
	case v == claims.Duplicate:
		return Decision{Verdict: v, Join: g.Store.Skip(key, hash)}
	case v == claims.Conflict:
		return Decision{Verdict: v}
	}
	join, err := g.pass(ctx, c, hooks)
	if err != nil {
		c.Release()
		g.Releases.Incr(1)
		return g.Fail(err)
	}
	b.passed[key] = hash
	g.Passed.Incr(1)
	return Decision{Verdict: claims.Pass, Join: join}
}

// pass records the claimed key now (Immediate) or registers the delivery
// hook that records it when the pipeline acknowledges the message.
func (g *Gate) pass(ctx context.Context, c Claim, hooks *commit.Hooks) (*commit.Participant, error) {
	if g.Immediate {
		if err := c.Commit(ctx); err != nil {
			return nil, fmt.Errorf("dedup_ledger: recording key %s in %s: %w", c.Key(), g.Store.Where(), err)
		}
		g.committed()
		return nil, nil
	}
	if hooks == nil {
		return nil, fmt.Errorf("dedup key %s: %w", c.Key(), g.Store.NoHooks())
	}
	if err := hooks.Register(g.onDelivered(c)); err != nil {
		return nil, fmt.Errorf("dedup key %s: %w", c.Key(), err)
	}
	return g.Store.Join(c), nil
}

func (g *Gate) committed() {
	g.Commits.Incr(1)
	if g.OnCommit != nil {
		g.OnCommit()
	}
}

// onDelivered is the delivery hook of a passed copy: it runs once with the
// pipeline's final result, before the input acknowledges the source.
func (g *Gate) onDelivered(c Claim) commit.DeliveryHook {
	return func(ctx context.Context, result error) error {
		if result != nil {
			// Nothing to undo if a writer on the ledger's file already
			// committed the key with its record: that effect is durable.
			if c.Release() {
				g.Releases.Incr(1)
			} else if c.Committed() {
				g.Commits.Incr(1)
			}
			return nil
		}
		// The events of a frame defer to the frame's Group: their keys go
		// into one transaction once every event's hooks ran.
		if bs, ok := g.Store.(batchStore); ok {
			if grp := commit.GroupFrom(ctx); grp != nil && grp.Defer(g, c, g.commitAll(bs)) == nil {
				return nil
			}
		}
		if err := c.Commit(ctx); err != nil {
			return g.notRecorded(c, err)
		}
		g.committed()
		return nil
	}
}

// notRecorded releases c, whose key could not be recorded, and says so.
// Failing the hook (or the Group's flush) keeps the source unacknowledged:
// the broker redelivers and the copy passes again.
func (g *Gate) notRecorded(c Claim, err error) error {
	if c.Release() {
		g.Releases.Incr(1)
	}
	return fmt.Errorf("dedup_ledger: recording key %s in %s failed, the message is not acknowledged and will be redelivered: %w", c.Key(), g.Store.Where(), err)
}

// commitAll is the flush of a Group's deferred claims (items): one
// CommitAll, one transaction, for all of them.
func (g *Gate) commitAll(bs batchStore) func(ctx context.Context, items []any) error {
	return func(ctx context.Context, items []any) error {
		cs := make([]Claim, len(items))
		for i, it := range items {
			cs[i] = it.(Claim)
		}
		var errs []error
		for i, err := range bs.CommitAll(ctx, cs) {
			if err != nil {
				errs = append(errs, g.notRecorded(cs[i], err))
				continue
			}
			g.committed()
		}
		return errors.Join(errs...)
	}
}

// ErrNoCommitPath explains what commit: auto needs from a bbolt ledger.
var ErrNoCommitPath = errors.New("dedup_ledger (commit: auto) cannot record this message's key: it did not come from reliable_mqtt_in, so nothing tells the ledger when its effect is committed. " +
	"Read it with reliable_mqtt_in (the key is then committed with the outbox record of a reliable_mqtt_out on the same file, or when the pipeline acknowledges the message), " +
	"or set commit: immediate to record keys before the output runs (like Benthos's dedupe: a failed output then loses the message)")

// ErrNoHooksSQL explains what an SQL ledger without apply needs.
var ErrNoHooksSQL = errors.New("dedup_ledger (sql without apply, commit: auto) cannot record this message's key: it did not come from reliable_mqtt_in, so nothing tells the ledger when its effect is committed. " +
	"Read it with reliable_mqtt_in, put the effect into sql.apply (then the key and the effect commit together), " +
	"or set commit: immediate (a failed output then loses the message)")
