package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/reliable-mqtt/reliable-mqtt/internal/claims"
	"github.com/reliable-mqtt/reliable-mqtt/internal/commit"
)

// ErrReleased is returned by Commit on a claim that was released.
var ErrReleased = errors.New("ledger: claim was released")

// Claim is the right of one in-flight message to apply its key. It ends
// exactly once: committed (the key is durably applied) or released (the
// message failed; the next copy may claim the key).
type Claim struct {
	l    *Ledger
	key  claims.Key
	enc  []byte
	hash [32]byte
	hold *claims.Hold
}

// Claim looks key up and, if it is not applied, claims it for one message
// whose payload hashes to hash. If another copy holds the key, it waits up
// to wait for that copy to settle (committed: Duplicate; released: this copy
// claims it); after that it fails with claims.ErrInFlight, so that the message is
// retried instead of passing twice or being dropped.
func (l *Ledger) Claim(ctx context.Context, key claims.Key, hash [32]byte, wait time.Duration) (*Claim, claims.Verdict, error) {
	enc, err := encodeKey(key)
	if err != nil {
		return nil, 0, err
	}
	// Claim before looking: a commit happens only under a claim, so no
	// commit of this key can slip between the lookup and the claim.
	hold, err := l.claims.Take(ctx, string(enc), wait)
	switch {
	case errors.Is(err, claims.ErrInFlight):
		return nil, 0, fmt.Errorf("dedup key %s: %w after waiting %s for it (the message fails and is retried): %w", key, claims.ErrInFlight, wait, context.DeadlineExceeded)
	case errors.Is(err, claims.ErrClosed):
		return nil, 0, fmt.Errorf("dedup ledger file %s: %w", l.path, ErrClosed)
	case err != nil:
		return nil, 0, fmt.Errorf("dedup key %s: waiting for another copy in flight: %w", key, err)
	}
	c := &Claim{l: l, key: key, enc: enc, hash: hash, hold: hold}
	var stored [32]byte
	applied := false
	err = l.file.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketKeys).Get(enc)
		if v == nil {
			return nil
		}
		_, h, err := decodeValue(enc, v)
		if err != nil {
			return l.damagedEntry(key, err)
		}
		stored, applied = h, true
		return nil
	})
	if err != nil {
		c.settle(claims.Released)
		return nil, 0, fmt.Errorf("dedup ledger file %s: looking up key %s: %w", l.path, key, err)
	}
	if applied {
		c.settle(claims.Released) // nothing to do; waiters look again and find it applied
		if stored == hash {
			return nil, claims.Duplicate, nil
		}
		return nil, claims.Conflict, nil
	}
	return c, claims.Pass, nil
}

// Key returns the claimed key.
func (c *Claim) Key() claims.Key { return c.key }

// Done is closed when the claim is committed or released.
func (c *Claim) Done() <-chan struct{} { return c.hold.Done() }

// Committed reports whether the key was durably applied under this claim.
func (c *Claim) Committed() bool {
	return c.hold.State() == claims.Committed
}

// Apply records the key inside tx, the transaction that writes the
// message's effect (a transaction participant). The claim counts as
// committed only when tx commits (tx.OnCommit); if tx rolls back nothing
// happened and Apply may run again in the retried transaction.
//
// One claim may be applied more than once: a message split after the
// processor carries the same claim on every part, and every part is part of
// the effect. While the claim is held no other copy of the key can write it,
// so a key found already present — earlier in this transaction, or
// committed by an earlier part — was written by this claim, and the part is
// written too. A real duplicate never reaches Apply: it is caught by Claim
// and guarded by SkipIfApplied.
func (c *Claim) Apply(tx *bolt.Tx) error {
	switch c.hold.State() {
	case claims.Committed:
		return nil // an earlier part committed the key
	case claims.Released:
		return fmt.Errorf("dedup key %s: its claim was released before the output wrote it (the message failed or timed out); the message is not written and will be retried", c.key)
	}
	existed, old, err := put(tx, c.enc, c.hash, c.l.now())
	if existed && err != nil {
		return c.l.damagedEntry(c.key, err)
	}
	if err != nil {
		return fmt.Errorf("dedup ledger file %s: recording key %s: %w", c.l.path, c.key, err)
	}
	if existed {
		if old == c.hash {
			return nil // an earlier part of this message, same transaction
		}
		return fmt.Errorf("dedup key %s is already applied with a different payload; not written", c.key)
	}
	tx.OnCommit(func() {
		c.l.commits.Add(1)
		c.l.keys.Add(1)
		c.settle(claims.Committed)
	})
	return nil
}

// Commit records the key in the ledger's own transaction, group-committed
// with other keys, and returns once it is durable (fsync'd).
func (c *Claim) Commit(ctx context.Context) error {
	switch c.hold.State() {
	case claims.Committed:
		return nil
	case claims.Released:
		return fmt.Errorf("dedup key %s: %w", c.key, ErrReleased)
	}
	return c.l.commit(ctx, []*Claim{c})[0]
}

// CommitAll records the keys of cs, claims of l, in ONE transaction of the
// ledger's own (with other waiting commits) and returns once it is durable:
// one error per claim, nil meaning on disk. Claims already committed are
// nil at once; released ones fail as Commit does.
func (l *Ledger) CommitAll(ctx context.Context, cs []*Claim) []error {
	errs := make([]error, len(cs))
	var todo []*Claim
	var at []int
	for i, c := range cs {
		switch c.hold.State() {
		case claims.Committed:
		case claims.Released:
			errs[i] = fmt.Errorf("dedup key %s: %w", c.key, ErrReleased)
		default:
			todo, at = append(todo, c), append(at, i)
		}
	}
	if len(todo) > 0 {
		for k, err := range l.commit(ctx, todo) {
			errs[at[k]] = err
		}
	}
	return errs
}

// Release gives the key up without applying it, so the next copy passes.
// It does nothing to a committed claim: a durable effect cannot be undone.
func (c *Claim) Release() bool { return c.settle(claims.Released) }

// settle ends the claim once; later calls do nothing and return false.
func (c *Claim) settle(to claims.State) bool { return c.hold.Settle(to) }

// SkipIfApplied returns a transaction participant for a message that is
// already known to be a duplicate: inside the writer's transaction it
// returns commit.ErrAlreadyApplied while the key is still applied with hash, so a writer on
// the ledger's file never stores a duplicate, and nil otherwise.
func (l *Ledger) SkipIfApplied(key claims.Key, hash [32]byte) func(tx *bolt.Tx) error {
	return func(tx *bolt.Tx) error {
		enc, err := encodeKey(key)
		if err != nil {
			return err
		}
		v := tx.Bucket(bucketKeys).Get(enc)
		if v == nil {
			return nil
		}
		_, h, err := decodeValue(enc, v)
		if err != nil {
			return l.damagedEntry(key, err) // never written as if new
		}
		if h == hash {
			return commit.ErrAlreadyApplied
		}
		return nil
	}
}

// InFlight returns the number of keys claimed and not yet settled.
func (l *Ledger) InFlight() int {
	return l.claims.Len()
}
