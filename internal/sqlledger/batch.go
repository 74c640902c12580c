package sqlledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/reliable-mqtt/reliable-mqtt/internal/claims"
)

// Entry is one message for ApplyBatch.
type Entry struct {
	Key   claims.Key
	Hash  []byte
	Stmts []Exec
}

// Outcome of one Entry in ApplyBatch. Err is set (a *StmtError or a ledger
// insert error) when that entry's work was rolled back to its savepoint;
// the other entries are unaffected.
type Outcome struct {
	Result
	Err error
}

// ApplyBatch does what Apply does for many messages in ONE transaction, so
// they share one commit (one fsync). An entry whose statement fails is
// reported in its Outcome and commits nothing; the others still commit:
// the transaction is rolled back and run again without it. (Savepoints
// would isolate it too, at two more statements for every entry; failures
// are rare.) A key repeated in entries is applied once (the later copies
// report Inserted false).
//
// A transient conflict (deadlock, serialization failure, SQLITE_BUSY) in
// any entry reruns the whole batch, as Apply does. The returned error is
// for the batch as a whole (begin, commit, retries exhausted): then no
// entry was committed, or, for a failed commit, none is known to be.
func (s *Store) ApplyBatch(ctx context.Context, entries []Entry) ([]Outcome, error) {
	if len(entries) == 0 {
		return nil, nil
	}
	out := make([]Outcome, len(entries))
	failed := make([]bool, len(entries)) // a statement of it failed: left out
	var attempts int
	err := s.retryRun(ctx, func(ctx context.Context) error {
		return s.leavingOut(entries, failed, out, func() (*stmtFailure, error) { return s.d.tryBatch(s, ctx, entries, failed, out) })
	}, &attempts)
	if err != nil {
		return nil, fmt.Errorf("sqlledger: apply batch of %d to table %s: %w; %s", len(entries), s.cfg.Table, err, outcome(err))
	}
	for i := range out {
		out[i].Attempts = attempts
	}
	return out, nil
}

// tryBatch runs one transaction of the entries not failed, statement by
// statement, and fills out. It returns the entry whose statement failed
// (everything rolled back), or an error for the whole transaction.
func (s *Store) tryBatch(ctx context.Context, entries []Entry, failed []bool, out []Outcome) (*stmtFailure, error) {
	var bad *stmtFailure
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		for i, e := range entries {
			if failed[i] {
				continue
			}
			if err := s.applyEntry(ctx, tx, e, &out[i]); err != nil {
				var se *StmtError
				if errors.As(err, &se) && !s.d.retryable(err) && !s.d.unavailable(err) {
					bad = &stmtFailure{entry: i, err: err}
				}
				return err // rolls back
			}
		}
		return nil
	})
	if bad != nil {
		return bad, nil
	}
	return nil, err
}

// stmtFailure is the statement failure of one entry of a batch.
type stmtFailure struct {
	entry int
	err   error
}

// leavingOut runs try until it succeeds or fails as a whole, leaving out
// (failed) each entry whose statement failed, with that error in its
// Outcome. Each round leaves one more entry out: bounded.
func (s *Store) leavingOut(entries []Entry, failed []bool, out []Outcome, try func() (*stmtFailure, error)) error {
	for range len(entries) + 1 {
		bad, err := try()
		if err != nil || bad == nil {
			return err
		}
		failed[bad.entry] = true
		out[bad.entry] = Outcome{Err: fmt.Errorf("sqlledger: apply %s: %w; this message rolled back, the rest of the batch unaffected", entries[bad.entry].Key, bad.err)}
	}
	return errors.New("sqlledger: internal error: a batch kept failing")
}

// applyEntry runs one entry in tx: the ledger insert, then (if it
// inserted) the statements, or (if not) the lookup of the stored hash.
func (s *Store) applyEntry(ctx context.Context, tx *sql.Tx, e Entry, o *Outcome) error {
	*o = Outcome{}
	ins, err := s.insert(ctx, tx, e.Key, e.Hash)
	if err != nil {
		return err
	}
	o.Inserted = ins
	if !ins {
		o.ExistingHash, _, err = s.lookup(ctx, tx, e.Key)
		return err
	}
	return runStmts(ctx, tx, e.Stmts)
}
