package sqlledger

import (
	"context"
	"database/sql"
	"fmt"
)

// Entry is one message for ApplyBatch.
type Entry struct {
	Key   Key
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
// they share one commit (one fsync). Each entry runs inside its own
// savepoint: an entry whose statement fails is rolled back alone and
// reported in its Outcome, and the others still commit. A key repeated in
// entries is applied once (the later copies report Inserted false).
//
// A transient conflict (deadlock, serialization failure, SQLITE_BUSY) in
// any entry reruns the whole batch, as Apply does. The returned error is
// for the batch as a whole (begin, commit, retries exhausted): then no
// entry was committed, or, for a failed commit, none is known to be.
func (s *Store) ApplyBatch(ctx context.Context, entries []Entry) ([]Outcome, error) {
	if len(entries) == 0 {
		return nil, nil
	}
	if s.d.driver == Postgres {
		return s.pgApplyBatch(ctx, entries)
	}
	var out []Outcome
	var attempts int
	err := s.retry(ctx, func(tx *sql.Tx) error {
		out = make([]Outcome, len(entries))
		for i, e := range entries {
			if err := s.applyEntry(ctx, tx, e, &out[i]); err != nil {
				return err
			}
		}
		return nil
	}, &attempts)
	if err != nil {
		return nil, fmt.Errorf("sqlledger: apply batch of %d to table %s: %w; %s", len(entries), s.cfg.Table, err, outcome(err))
	}
	for i := range out {
		out[i].Attempts = attempts
	}
	return out, nil
}

// applyEntry runs one entry inside a savepoint. It returns an error only
// when the whole transaction must stop: a transient conflict (to retry the
// batch) or a savepoint command that failed.
func (s *Store) applyEntry(ctx context.Context, tx *sql.Tx, e Entry, o *Outcome) error {
	if _, err := tx.ExecContext(ctx, "SAVEPOINT ledger_entry"); err != nil {
		return fmt.Errorf("savepoint for %s: %w", e.Key, err)
	}
	err := func() error {
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
	}()
	if err != nil {
		if s.d.retryable(err) || s.d.unavailable(err) {
			return err // the whole transaction is retried
		}
		// Only this entry's work is undone; the transaction stays usable
		// (in PostgreSQL an error aborts the transaction until this).
		if _, rerr := tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT ledger_entry"); rerr != nil {
			return fmt.Errorf("roll back %s to its savepoint after %v: %w", e.Key, err, rerr)
		}
		*o = Outcome{Err: fmt.Errorf("sqlledger: apply %s: %w; this message rolled back, the rest of the batch unaffected", e.Key, err)}
	}
	if _, err := tx.ExecContext(ctx, "RELEASE SAVEPOINT ledger_entry"); err != nil {
		return fmt.Errorf("release savepoint for %s: %w", e.Key, err)
	}
	return nil
}
