package ledger

import (
	"context"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/reliable-mqtt/reliable-mqtt/internal/claims"
	"github.com/reliable-mqtt/reliable-mqtt/internal/groupcommit"
)

// commitReq is one Claim.Commit, or one CommitAll, handed to the
// committer: its claims go into one transaction.
type commitReq struct {
	cs   []*Claim
	errs []error // one per claim
	done chan struct{}
}

// commit hands cs to the committer and waits for the durable result, one
// error per claim. Once the committer has the request its result is always
// awaited, so an error means "not recorded" and nil means "on disk".
func (l *Ledger) commit(ctx context.Context, cs []*Claim) []error {
	errs := make([]error, len(cs))
	fail := func(err error) []error {
		for i, c := range cs {
			errs[i] = fmt.Errorf("dedup key %s not recorded: %w", c.key, err)
		}
		return errs
	}
	if err := ctx.Err(); err != nil {
		return fail(err)
	}
	r := &commitReq{cs: cs, errs: errs, done: make(chan struct{}, 1)}
	select {
	case l.reqs <- r:
	case <-ctx.Done():
		return fail(ctx.Err())
	case <-l.closing:
		return fail(fmt.Errorf("ledger file %s: %w", l.path, ErrClosed))
	}
	<-r.done
	return r.errs
}

// commitLoop is the ledger's single writer: every waiting Commit or
// CommitAll, up to MaxBatch requests, is recorded in one transaction (one
// fsync per group).
func (l *Ledger) commitLoop() {
	defer close(l.committerDone)
	groupcommit.Run(l.reqs, l.closing, l.opts.MaxBatch, func(group []*commitReq) {
		l.commitBatch(group)
		l.transactions.Add(1)
		for _, r := range group {
			r.done <- struct{}{}
		}
	})
}

// claimReq is one claim of a request and where its result goes.
type claimReq struct {
	c   *Claim
	err *error
}

func (l *Ledger) commitBatch(reqs []*commitReq) {
	now := l.now()
	// One claim per entry, the requests' claims in order.
	var batch []claimReq
	for _, r := range reqs {
		for i := range r.cs {
			batch = append(batch, claimReq{c: r.cs[i], err: &r.errs[i]})
		}
	}
	added := make([]bool, len(batch))
	err := l.file.Update(func(tx *bolt.Tx) error {
		for i, r := range batch {
			added[i] = false
			existed, old, err := put(tx, r.c.enc, r.c.hash, now)
			if existed && err != nil {
				// A damaged entry fails its own key only; nothing is written.
				*r.err = l.damagedEntry(r.c.key, err)
				continue
			}
			if err != nil {
				return fmt.Errorf("recording key %s: %w", r.c.key, err)
			}
			*r.err = nil
			if existed && old != r.c.hash {
				// Only possible if the file was changed behind our back;
				// nothing was written for this key.
				*r.err = fmt.Errorf("dedup key %s is already applied with a different payload in %s; not recorded again", r.c.key, l.path)
			}
			added[i] = !existed
		}
		return nil
	})
	if err != nil {
		err = fmt.Errorf("dedup ledger file %s: commit failed, no key of this group was recorded: %w", l.path, err)
		for _, r := range batch {
			*r.err = err
		}
		return
	}
	for i, r := range batch {
		if added[i] {
			l.commits.Add(1)
			l.keys.Add(1)
		}
		if *r.err != nil {
			// The stored entry is someone else's: this claim applied nothing.
			r.c.settle(claims.Released)
			continue
		}
		r.c.settle(claims.Committed)
	}
}
