package sqlledger

// Running a transaction against a database that may fail over: whole
// transactions are retried on transient conflicts and while no server
// answers, and a COMMIT whose outcome is unknown is reported as such.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/backoff"
	"github.com/reliable-mqtt/reliable-mqtt/internal/ledgerclock"
)

// retry runs fn in a transaction and commits, rerunning the whole
// transaction when the database reports a transient conflict (at most
// MaxRetries times) or is unavailable (until ctx ends: a failover takes as
// long as it takes, and the messages wait unacknowledged). attempts, if not
// nil, receives how many times fn ran.
func (s *Store) retry(ctx context.Context, fn func(context.Context, *sql.Tx) error, attempts *int) error {
	return s.retryRun(ctx, func(ctx context.Context) error {
		return s.inTx(ctx, func(tx *sql.Tx) error { return fn(ctx, tx) })
	}, attempts)
}

// retryRun is retry for a transaction that run makes and commits itself.
// Each attempt gets a context bounded by TxTimeout: a server that stops
// answering without closing the connection (a machine that died, a
// partition) would otherwise hold the transaction until TCP gives up, which
// takes hours. The abandoned attempt counts as unavailable and is retried;
// if its COMMIT had landed, the ledger rows say so.
func (s *Store) retryRun(ctx context.Context, run func(context.Context) error, attempts *int) error {
	b := s.cfg.backoff()
	conflicts := 0
	for n := 1; ; n++ {
		if attempts != nil {
			*attempts = n
		}
		actx, cancel := context.WithTimeout(ctx, s.cfg.TxTimeout)
		err := run(actx)
		cancel()
		if err == nil {
			if n > 1 && s.waiting.CompareAndSwap(true, false) {
				s.logf("sqlledger: %s answers again; transactions continue", s.where)
				if f := s.cfg.OnAvailable; f != nil {
					f(true)
				}
			}
			return nil
		}
		down := s.d.unavailable(err)
		if !down {
			conflicts++
		}
		if ctx.Err() != nil || (!down && (!s.d.retryable(err) || conflicts > s.cfg.MaxRetries)) {
			if s.d.retryable(err) {
				return fmt.Errorf("gave up after %d attempts: %w", n, err)
			}
			return err
		}
		if down {
			s.noteDown(err)
		}
		if f := s.cfg.OnRetry; f != nil {
			f(down)
		}
		// Jitter over the upper half: concurrent losers of the same conflict
		// spread out.
		wait := b.After(n)
		t := time.NewTimer(wait/2 + rand.N(wait/2+1))
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (retrying after: %v)", ctx.Err(), err)
		case <-t.C:
		}
	}
}

// backoff is the delay between attempts of a transaction.
func (c Config) backoff() backoff.Backoff {
	return backoff.Backoff{Initial: c.RetryInitial, Max: c.RetryMax}
}

// noteDown logs, at most every downLogEvery, that transactions wait for a
// read-write server.
func (s *Store) noteDown(err error) {
	if !s.waiting.Swap(true) {
		if f := s.cfg.OnAvailable; f != nil {
			f(false)
		}
	}
	now := ledgerclock.System().Mono().Nanoseconds() + int64(downLogEvery) // monotonic: a wall-clock step must not silence it; the first line always goes out
	last := s.lastDownLog.Load()
	if now-last < int64(downLogEvery) || !s.lastDownLog.CompareAndSwap(last, now) {
		return
	}
	s.logf("sqlledger: %s has no read-write server answering (%v); retrying the transaction (ledger row and apply statements together) until one does; its messages stay unacknowledged", s.where, err)
}

// downLogEvery spaces the "no read-write server" lines of one store.
const downLogEvery = 10 * time.Second

func (s *Store) logf(format string, args ...any) {
	if f := s.cfg.Logf; f != nil {
		f(format, args...)
	}
}

func (s *Store) inTx(ctx context.Context, fn func(*sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin transaction: %w", err)
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback() // the error that matters is fn's
		return err
	}
	if err := tx.Commit(); err != nil {
		return &commitError{err}
	}
	return nil
}

// commitError marks a failed COMMIT: unlike any earlier failure, the
// transaction may or may not have landed.
type commitError struct{ err error }

func (e *commitError) Error() string { return "commit: " + e.err.Error() }
func (e *commitError) Unwrap() error { return e.err }

// outcome words the end of an error message: what the caller can assume.
func outcome(err error) string {
	var ce *commitError
	if errors.As(err, &ce) {
		return "the commit's outcome is unknown; applying the same key again is safe"
	}
	return "rolled back, nothing committed"
}

// IsUnavailable reports whether err means that no read-write server
// answered (connection lost or refused, server shutting down or starting,
// a standby): work that failed so can succeed later, unlike a refused
// statement, a wrong password or a missing database.
func (s *Store) IsUnavailable(err error) bool { return s.d.unavailable(err) }

// IsRetryable reports whether err is a transient conflict (serialization
// failure, deadlock, SQLITE_BUSY/LOCKED) that Apply would retry.
func (s *Store) IsRetryable(err error) bool { return s.d.retryable(err) }
