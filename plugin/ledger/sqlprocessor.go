package ledger

import (
	"context"
	"fmt"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/dedup"
	"github.com/reliable-mqtt/reliable-mqtt/internal/shutdown"
	"github.com/reliable-mqtt/reliable-mqtt/internal/sqlargs"
	"github.com/reliable-mqtt/reliable-mqtt/internal/sqlledger"
)

// sqlProcessor is dedup_ledger on an SQL table. Two modes:
//
//   - with sql.apply: the ledger insert and the statements run in one
//     transaction that commits inside ProcessBatch, before the message
//     moves on. Invariant (enforced by sqlledger.Apply): the row exists iff
//     the statements committed with it. The broker's ack still follows the
//     pipeline's ack, so a crash between commit and PUBACK only causes a
//     redelivery, which finds the row and is dropped or flagged.
//   - without apply: like the bbolt store — claim in the processor, record
//     the key in the delivery hook when the pipeline acks, release on nack.
type sqlProcessor struct {
	common
	sh *sqlledger.Pool
}

// newSQLProcessor opens the SQL ledger of s (s.sql is set).
func newSQLProcessor(s settings, mgr *service.Resources) (*sqlProcessor, error) {
	p := &sqlProcessor{common: newCommon(s, mgr)}
	// Benthos gives constructors no context and offers a processor no say
	// in /ready: while no read-write server answers, the constructor waits
	// (each attempt bounded by connect_timeout, the whole by startup_wait),
	// so the stream is not built, /ready is not 200 and no message is
	// taken. Before the stream exists SIGTERM ends the process at once.
	pc := s.sql.pool
	pc.Retention, pc.OnKeys, pc.Logf = s.retention, func(n int64) { p.m.keys.Set(n) }, p.log.Warnf
	pc.OnAvailable = func(up bool) {
		if up {
			p.m.sqlAvailable.Set(1)
		} else {
			p.m.sqlAvailable.Set(0)
		}
	}
	pc.OnRetry = func(unavailable bool) {
		if unavailable {
			p.m.sqlRetries.Incr(1, "unavailable")
		} else {
			p.m.sqlRetries.Incr(1, "conflict")
		}
	}
	pc.OnAvailable(false) // until the pool is open
	var err error
	p.sh, err = sqlledger.OpenPool(context.Background(), pc)
	if err != nil {
		return nil, err
	}
	pc.OnAvailable(true)
	p.gate.Store = dedup.SQL(p.sh)
	return p, nil
}

// ProcessBatch checks and (with apply) commits every message of the batch.
func (p *sqlProcessor) ProcessBatch(ctx context.Context, batch service.MessageBatch) ([]service.MessageBatch, error) {
	if len(p.s.sql.apply) > 0 {
		return batchOf(p.applyBatch(ctx, batch)), nil
	}
	return batchOf(p.check(ctx, batch)), nil
}

// applyBatch hands every message's transaction work to the pool at once, so
// that concurrent messages share transactions. A message moves on only
// after its commit.
func (p *sqlProcessor) applyBatch(ctx context.Context, batch service.MessageBatch) service.MessageBatch {
	results := make([]*service.Message, len(batch)) // nil: dropped
	var entries []sqlledger.Entry
	var of []int // message of each entry
	args := make([]*service.MessageBatchBloblangExecutor, len(p.s.sql.apply))
	for j, st := range p.s.sql.apply {
		args[j] = sqlargs.For(batch, st.Args)
	}
	for i, msg := range batch {
		entry, err := p.entryFor(batch, args, i)
		if err != nil {
			results[i] = p.fail(msg, err)
			continue
		}
		entries, of = append(entries, entry), append(of, i)
	}
	for j, d := range p.gate.Apply(ctx, p.sh, entries) {
		results[of[j]] = p.decide(batch[of[j]], entries[j].Key, d)
	}
	out := make(service.MessageBatch, 0, len(batch))
	for _, m := range results {
		if m != nil {
			out = append(out, m)
		}
	}
	return out
}

// entryFor evaluates the key, the payload hash and every statement's
// arguments (args[j] for statement j) of message i.
func (p *sqlProcessor) entryFor(batch service.MessageBatch, args []*service.MessageBatchBloblangExecutor, i int) (sqlledger.Entry, error) {
	key, hash, err := p.keyOf(batch, i)
	if err != nil {
		return sqlledger.Entry{}, err
	}
	stmts := make([]sqlledger.Exec, 0, len(p.s.sql.apply))
	for j, st := range p.s.sql.apply {
		var stmtArgs []any
		if args[j] != nil {
			if stmtArgs, err = sqlargs.Of(args[j], i); err != nil {
				return sqlledger.Entry{}, fmt.Errorf("dedup_ledger: key %s: sql.apply[%d].args_mapping: %w; nothing was committed", key, j, err)
			}
		}
		stmts = append(stmts, sqlledger.Exec{Query: st.Query, Args: stmtArgs})
	}
	return sqlledger.Entry{Key: key, Hash: hash[:], Stmts: stmts}, nil
}

// Close gives back this thread's share of the store; the last one closes
// the pool (bounded inside release).
func (p *sqlProcessor) Close(ctx context.Context) error {
	return p.closeOnceWithin(ctx, shutdown.Outer(shutdown.Outer(shutdown.Commit)), "the SQL dedup ledger (table "+p.s.sql.pool.Table+")", p.sh.Release)
}
