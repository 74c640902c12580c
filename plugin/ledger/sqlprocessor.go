package ledger

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/claims"
	"github.com/reliable-mqtt/reliable-mqtt/internal/commit"
	"github.com/reliable-mqtt/reliable-mqtt/internal/failpoint"
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

func newSQLProcessor(conf *service.ParsedConfig, mgr *service.Resources) (*sqlProcessor, error) {
	s, err := parseSettings(conf)
	if err != nil {
		return nil, err
	}
	if s.sql == nil {
		return nil, errors.New("dedup_ledger: internal error: the SQL processor was given no sql config")
	}
	if err := mkdirForSQLite(s.sql.cfg); err != nil {
		return nil, err
	}
	m := newMetrics(mgr, s)
	log := mgr.Logger()
	// Open is bounded by connect_timeout; Benthos gives constructors no context.
	sh, err := sqlledger.OpenPool(context.Background(), sqlledger.PoolConfig{
		Config: s.sql.cfg, Init: s.sql.init, MaxBatch: s.sql.maxBatch, Retention: s.retention,
		OnKeys: func(n int64) { m.keys.Set(n) }, Logf: log.Errorf,
	})
	if err != nil {
		return nil, err
	}
	return &sqlProcessor{common: common{s: s, log: log, m: m}, sh: sh}, nil
}

// ProcessBatch checks and (with apply) commits every message of the batch.
func (p *sqlProcessor) ProcessBatch(ctx context.Context, batch service.MessageBatch) ([]service.MessageBatch, error) {
	var out service.MessageBatch
	if len(p.s.sql.apply) > 0 {
		out = p.applyBatch(ctx, batch)
	} else {
		out = p.claimBatch(ctx, batch)
	}
	if len(out) == 0 {
		return nil, nil
	}
	return []service.MessageBatch{out}, nil
}

// applyBatch submits every message's transaction work at once, so that
// the workers can put concurrent messages into one transaction, then waits
// for each outcome. A message moves on only after its commit.
func (p *sqlProcessor) applyBatch(ctx context.Context, batch service.MessageBatch) service.MessageBatch {
	results := make([]*service.Message, len(batch)) // nil: dropped
	reqs := make([]*sqlledger.Request, len(batch))
	for i, msg := range batch {
		entry, err := p.entryFor(batch, i)
		if err != nil {
			results[i] = p.fail(msg, err)
			continue
		}
		req := sqlledger.NewRequest(entry, false)
		if err := p.sh.Submit(ctx, req); err != nil {
			results[i] = p.fail(msg, fmt.Errorf("dedup key %s: %w", entry.Key, err))
			continue
		}
		reqs[i] = req
	}
	for i, req := range reqs {
		if req == nil {
			continue
		}
		msg := batch[i]
		o := p.sh.Wait(ctx, req)
		switch {
		case o.Err != nil:
			results[i] = p.fail(msg, fmt.Errorf("dedup_ledger: the apply transaction of key %s failed, nothing was committed and the message is not acknowledged (it will be retried): %w", req.Entry().Key, o.Err))
		case o.Inserted:
			// Committed, not yet acknowledged: the crash window of seed 001.
			failpoint.Hit(failpoint.SQLCommitted)
			p.m.commits.Incr(1)
			p.m.passed.Incr(1)
			results[i] = msg
		case len(o.ExistingHash) > 0 && !bytes.Equal(o.ExistingHash, req.Entry().Hash):
			results[i] = p.conflict(msg, req.Entry().Key)
		default:
			results[i] = p.duplicate(msg, req.Entry().Key)
		}
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
// arguments of message i.
func (p *sqlProcessor) entryFor(batch service.MessageBatch, i int) (sqlledger.Entry, error) {
	key, hash, err := p.keyAndHash(batch, i)
	if err != nil {
		return sqlledger.Entry{}, err
	}
	stmts := make([]sqlledger.Exec, 0, len(p.s.sql.apply))
	for j, st := range p.s.sql.apply {
		var args []any
		if st.args != nil {
			if args, err = sqlargs.Of(batch, i, st.args); err != nil {
				return sqlledger.Entry{}, fmt.Errorf("dedup_ledger: key %s: sql.apply[%d].args_mapping: %w; nothing was committed", key, j, err)
			}
		}
		stmts = append(stmts, sqlledger.Exec{Query: st.query, Args: args})
	}
	return sqlledger.Entry{Key: key, Hash: hash[:], Stmts: stmts}, nil
}

// claimBatch is the mode without apply: the key is recorded when the
// pipeline acknowledges the message (or at once with commit: immediate).
func (p *sqlProcessor) claimBatch(ctx context.Context, batch service.MessageBatch) service.MessageBatch {
	out := make(service.MessageBatch, 0, len(batch))
	inBatch := map[sqlledger.Key][32]byte{} // passed keys and their hashes
	for i, msg := range batch {
		key, hash, err := p.keyAndHash(batch, i)
		if err != nil {
			out = append(out, p.fail(msg, err))
			continue
		}
		// Copies inside one batch share its fate: waiting would wait for
		// ourselves.
		if earlier, ok := inBatch[key]; ok {
			if earlier != hash {
				out = append(out, p.conflict(msg, key))
			} else if m := p.duplicate(msg, key); m != nil {
				out = append(out, m)
			}
			continue
		}
		claim, v, err := p.sh.Claim(ctx, key, hash[:], p.s.waitTimeout)
		switch {
		case err != nil:
			out = append(out, p.fail(msg, fmt.Errorf("dedup_ledger: checking key %s: %w", key, err)))
			continue
		case v == claims.Duplicate:
			if m := p.duplicate(msg, key); m != nil {
				out = append(out, m)
			}
			continue
		case v == claims.Conflict:
			out = append(out, p.conflict(msg, key))
			continue
		}
		if err := p.arrangeRecord(ctx, msg, claim, hash[:]); err != nil {
			claim.Settle()
			p.m.releases.Incr(1)
			out = append(out, p.fail(msg, err))
			continue
		}
		inBatch[key] = hash
		p.m.passed.Incr(1)
		out = append(out, msg)
	}
	return out
}

// arrangeRecord records the key now (commit: immediate) or registers the
// delivery hook that records it when the pipeline acknowledges.
func (p *sqlProcessor) arrangeRecord(ctx context.Context, msg *service.Message, claim *sqlledger.Claim, hash []byte) error {
	record := func(ctx context.Context) error {
		o := p.sh.Do(ctx, sqlledger.NewRequest(sqlledger.Entry{Key: claim.Key(), Hash: hash}, true))
		return o.Err
	}
	if p.s.immediate {
		err := record(ctx)
		claim.Settle()
		if err != nil {
			return fmt.Errorf("dedup_ledger: recording key %s: %w", claim.Key(), err)
		}
		p.m.commits.Incr(1)
		return nil
	}
	hooks := commit.HooksFrom(msg.Context())
	if hooks == nil {
		return fmt.Errorf("dedup key %s: %w", claim.Key(), errNoHooksSQL)
	}
	return hooks.Register(func(ctx context.Context, result error) error {
		defer claim.Settle()
		if result != nil {
			p.m.releases.Incr(1)
			return nil
		}
		if err := record(ctx); err != nil {
			p.m.releases.Incr(1)
			// Failing the hook keeps the source unacknowledged: redelivered,
			// the copy passes again.
			return fmt.Errorf("dedup_ledger: recording key %s failed, the message is not acknowledged and will be redelivered: %w", claim.Key(), err)
		}
		p.m.commits.Incr(1)
		return nil
	})
}

var errNoHooksSQL = errors.New("dedup_ledger (sql without apply, commit: auto) cannot record this message's key: it did not come from reliable_mqtt_in, so nothing tells the ledger when its effect is committed. " +
	"Read it with reliable_mqtt_in, put the effect into sql.apply (then the key and the effect commit together), " +
	"or set commit: immediate (a failed output then loses the message)")

// mkdirForSQLite creates the directory of an SQLite file, as the bbolt
// store does for path, so a fresh data directory works out of the box.
func mkdirForSQLite(c sqlledger.Config) error {
	if c.Driver != sqlledger.SQLite || strings.HasPrefix(c.DSN, "file:") || strings.HasPrefix(c.DSN, ":memory:") {
		return nil
	}
	path, _, _ := strings.Cut(c.DSN, "?")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("dedup_ledger: creating the directory of SQLite database %s: %w", path, err)
	}
	return nil
}

// keyAndHash evaluates the key and the payload hash of message i.
func (p *sqlProcessor) keyAndHash(batch service.MessageBatch, i int) (sqlledger.Key, [32]byte, error) {
	ns, id, err := p.keyOf(batch, i)
	if err != nil {
		return sqlledger.Key{}, [32]byte{}, err
	}
	key := sqlledger.Key{Namespace: ns, ID: id}
	hash, err := hashOf(batch[i], key)
	return key, hash, err
}

// Close gives back this thread's share of the store; the last one closes
// the pool (bounded inside release).
func (p *sqlProcessor) Close(ctx context.Context) error {
	return p.closeOnceWithin(ctx, shutdown.Outer(shutdown.Outer(shutdown.Commit)), "the SQL dedup ledger (table "+p.s.sql.cfg.Table+")", p.sh.Release)
}
