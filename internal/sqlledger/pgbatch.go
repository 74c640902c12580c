package sqlledger

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/reliable-mqtt/reliable-mqtt/internal/claims"
)

// PostgreSQL's ApplyBatch sends a group's transaction in one round trip
// when none of its keys is in the table, the usual case:
//
//	BEGIN; one INSERT of every key (unnest of arrays, no ON CONFLICT);
//	every statement of every message; COMMIT — pipelined.
//
// A key already there fails that INSERT (unique_violation), which aborts
// the transaction before any statement ran; it is rolled back and the
// group runs in two round trips, which tell new keys from present ones:
//
//  1. BEGIN and one INSERT of every key (ON CONFLICT DO NOTHING RETURNING
//     the keys it inserted);
//  2. the stored hashes of the keys that were there already, every
//     statement of the inserted ones, and COMMIT, pipelined.
//
// After a group that found a key present the store takes the two round
// trips until a group finds none (a stream of redeliveries would otherwise
// pay three). No savepoints (see ApplyBatch): when a statement fails, the
// transaction is rolled back and run again without that message.

// pgInsertMany inserts the keys of a group, stamped with the ledger
// clock's reading (clock.go); %[1]s = quoted table, %[2]s = quoted clock
// table.
const pgInsertMany = `INSERT INTO %[1]s ("namespace", "key", "hash", "applied_at")
SELECT u.*, (SELECT "reading" FROM %[2]s WHERE "id" = 1) FROM unnest($1::text[], $2::text[], $3::bytea[]) AS u
ON CONFLICT ("namespace", "key") DO NOTHING RETURNING "namespace", "key"`

// pgInsertNew inserts the keys of a group that are all expected to be new;
// one that is present fails it. As pgInsertMany.
const pgInsertNew = `INSERT INTO %[1]s ("namespace", "key", "hash", "applied_at")
SELECT u.*, (SELECT "reading" FROM %[2]s WHERE "id" = 1) FROM unnest($1::text[], $2::text[], $3::bytea[]) AS u`

// pgLookupMany reads the hashes of keys; %s = quoted table.
const pgLookupMany = `SELECT t."namespace", t."key", t."hash" FROM %s t
JOIN unnest($1::text[], $2::text[]) AS k(ns, id) ON t."namespace" = k.ns AND t."key" = k.id`

// pgTry runs one transaction of the entries not failed and fills out. It
// returns the entry whose statement failed (everything rolled back), or
// an error for the whole transaction (a commitError for COMMIT).
func (s *Store) pgTry(ctx context.Context, entries []Entry, failed []bool, out []Outcome) (*stmtFailure, error) {
	// The first live copy of each key is applied; later copies in the same
	// group report what the first found.
	first := map[claims.Key]int{}
	var applied []int
	for i, e := range entries {
		if failed[i] {
			continue
		}
		if _, ok := first[e.Key]; !ok {
			first[e.Key] = i
			applied = append(applied, i)
		}
	}
	if len(applied) == 0 {
		return nil, nil
	}
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("get connection: %w", err)
	}
	defer conn.Close()
	var bad *stmtFailure
	err = conn.Raw(func(dc any) error {
		sc, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("sqlledger: internal error: connection is %T, not pgx", dc)
		}
		var err error
		bad, err = s.pgTx(ctx, sc.Conn(), entries, applied, out)
		return err
	})
	if err != nil {
		return nil, err
	}
	if bad != nil {
		return bad, nil
	}
	for i, e := range entries {
		if f, ok := first[e.Key]; ok && f != i && !failed[i] {
			h := out[f].ExistingHash
			if out[f].Inserted {
				h = entries[f].Hash
			}
			out[i] = Outcome{Result: Result{ExistingHash: h}}
		}
	}
	return nil, nil
}

// pgTx is the transaction of pgTry on one connection.
func (s *Store) pgTx(ctx context.Context, c *pgx.Conn, entries []Entry, applied []int, out []Outcome) (*stmtFailure, error) {
	// Prepared once per connection (pgx keeps them by text). A statement
	// the server cannot even prepare (a missing table) fails its message
	// before any transaction, where the batch would not say whose it is.
	for _, i := range applied {
		for j, st := range entries[i].Stmts {
			if _, err := c.Prepare(ctx, st.Query, st.Query); err != nil {
				if s.d.retryable(err) || s.d.unavailable(err) {
					return nil, err
				}
				return &stmtFailure{entry: i, err: &StmtError{Index: j, Query: st.Query, Err: err}}, nil
			}
		}
	}
	nss, ids := make([]string, len(applied)), make([]string, len(applied))
	hashes := make([][]byte, len(applied))
	for j, i := range applied {
		nss[j], ids[j], hashes[j] = entries[i].Key.Namespace, entries[i].Key.ID, entries[i].Hash
	}
	if !s.pgKeysSeen.Load() {
		bad, err := s.pgTxNew(ctx, c, entries, applied, out, nss, ids, hashes)
		if !errors.Is(err, errKeyPresent) {
			return bad, err
		}
		s.pgKeysSeen.Store(true)
	}
	var b1 pgx.Batch
	b1.Queue("BEGIN")
	b1.Queue(s.pgInsertSQL, nss, ids, hashes)
	inserted := map[claims.Key]bool{}
	err := func() error {
		br := c.SendBatch(ctx, &b1)
		defer br.Close()
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("begin transaction: %w", err)
		}
		rows, err := br.Query()
		if err != nil {
			return fmt.Errorf("insert ledger rows: %w", err)
		}
		for rows.Next() {
			var k claims.Key
			if err := rows.Scan(&k.Namespace, &k.ID); err != nil {
				rows.Close()
				return fmt.Errorf("insert ledger rows: %w", err)
			}
			inserted[k] = true
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("insert ledger rows: %w", err)
		}
		return br.Close()
	}()
	if err != nil {
		return nil, s.pgAbort(ctx, c, err)
	}

	var b2 pgx.Batch
	var oldNs, oldIDs []string
	for _, i := range applied {
		k := entries[i].Key
		out[i] = Outcome{Result: Result{Inserted: inserted[k]}}
		if !inserted[k] {
			oldNs, oldIDs = append(oldNs, k.Namespace), append(oldIDs, k.ID)
		}
	}
	if len(oldNs) > 0 {
		b2.Queue(s.pgLookupSQL, oldNs, oldIDs)
	} else {
		s.pgKeysSeen.Store(false) // the next group tries one round trip again
	}
	for _, i := range applied {
		if !out[i].Inserted {
			continue
		}
		for _, st := range entries[i].Stmts {
			b2.Queue(st.Query, st.Args...)
		}
	}
	b2.Queue("COMMIT")
	br := c.SendBatch(ctx, &b2)
	if len(oldNs) > 0 {
		rows, err := br.Query()
		if err == nil {
			byKey := map[claims.Key]int{}
			for _, i := range applied {
				byKey[entries[i].Key] = i
			}
			for rows.Next() {
				var k claims.Key
				var h []byte
				if err = rows.Scan(&k.Namespace, &k.ID, &h); err != nil {
					break
				}
				if i, ok := byKey[k]; ok {
					out[i].ExistingHash = h
				}
			}
			rows.Close()
			if err == nil {
				err = rows.Err()
			}
		}
		if err != nil {
			br.Close()
			return nil, s.pgAbort(ctx, c, fmt.Errorf("look up ledger rows: %w", err))
		}
	}
	for _, i := range applied {
		if !out[i].Inserted {
			continue
		}
		if bad, err := s.pgStmts(ctx, c, br, entries, i); bad != nil || err != nil {
			return bad, err
		}
	}
	return nil, s.pgCommit(br)
}

// errKeyPresent: a key of the group is in the table already; the
// transaction was rolled back before any statement ran.
var errKeyPresent = errors.New("a key of the group is present")

// pgTxNew is pgTx in one round trip, for a group whose keys are all new
// (see the top of this file). It returns errKeyPresent, after rolling
// back, when one is not; otherwise what pgTx returns.
func (s *Store) pgTxNew(ctx context.Context, c *pgx.Conn, entries []Entry, applied []int, out []Outcome, nss, ids []string, hashes [][]byte) (*stmtFailure, error) {
	n := 3 // BEGIN, INSERT, COMMIT
	for _, i := range applied {
		n += len(entries[i].Stmts)
	}
	b := pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, n)}
	b.Queue("BEGIN")
	b.Queue(s.pgInsertNewSQL, nss, ids, hashes)
	for _, i := range applied {
		out[i] = Outcome{Result: Result{Inserted: true}}
		for _, st := range entries[i].Stmts {
			b.Queue(st.Query, st.Args...)
		}
	}
	b.Queue("COMMIT")
	br := c.SendBatch(ctx, &b)
	if _, err := br.Exec(); err != nil {
		br.Close()
		return nil, s.pgAbort(ctx, c, fmt.Errorf("begin transaction: %w", err))
	}
	if _, err := br.Exec(); err != nil {
		br.Close()
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == pgUniqueViolation {
			if aerr := s.pgAbort(ctx, c, err); aerr != err {
				return nil, aerr
			}
			return nil, errKeyPresent
		}
		return nil, s.pgAbort(ctx, c, fmt.Errorf("insert ledger rows: %w", err))
	}
	for _, i := range applied {
		if bad, err := s.pgStmts(ctx, c, br, entries, i); bad != nil || err != nil {
			return bad, err
		}
	}
	return nil, s.pgCommit(br)
}

// pgUniqueViolation is PostgreSQL's SQLSTATE unique_violation.
const pgUniqueViolation = "23505"

// pgStmts reads the results of entry i's statements from br. On a failure
// it closes br and rolls back: a statement error is that entry's
// (stmtFailure), a conflict or a lost server the whole transaction's.
func (s *Store) pgStmts(ctx context.Context, c *pgx.Conn, br pgx.BatchResults, entries []Entry, i int) (*stmtFailure, error) {
	for j, st := range entries[i].Stmts {
		if _, err := br.Exec(); err != nil {
			br.Close()
			if s.d.retryable(err) || s.d.unavailable(err) {
				return nil, s.pgAbort(ctx, c, err)
			}
			if aerr := s.pgAbort(ctx, c, err); aerr != err {
				return nil, aerr // the rollback failed: the whole transaction is in doubt
			}
			return &stmtFailure{entry: i, err: &StmtError{Index: j, Query: st.Query, Err: err}}, nil
		}
	}
	return nil, nil
}

// pgCommit reads COMMIT's result, the last of br, and closes br. An error
// is a commitError: the outcome is unknown.
func (s *Store) pgCommit(br pgx.BatchResults) error {
	_, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return &commitError{err}
	}
	return nil
}

// pgAbort rolls the open transaction back after err and returns err, or
// an error saying that the rollback failed too (the connection is then
// closed, which rolls back on the server).
func (s *Store) pgAbort(ctx context.Context, c *pgx.Conn, err error) error {
	if c.IsClosed() {
		return err
	}
	if _, rerr := c.Exec(ctx, "ROLLBACK"); rerr != nil {
		c.Close(ctx)
		return fmt.Errorf("%w (and the rollback failed: %v)", err, rerr)
	}
	return err
}
