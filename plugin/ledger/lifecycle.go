package ledger

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/claims"
	"github.com/reliable-mqtt/reliable-mqtt/internal/commit"
	"github.com/reliable-mqtt/reliable-mqtt/internal/dedup"
	"github.com/reliable-mqtt/reliable-mqtt/internal/ledger"
	"github.com/reliable-mqtt/reliable-mqtt/internal/shutdown"
	"github.com/reliable-mqtt/reliable-mqtt/internal/tracing"
)

// processor is one pipeline thread's dedup_ledger on a bbolt file. Benthos
// builds one per thread; they share the file's *ledger.Ledger and so its
// claims.
type processor struct {
	common
	l *ledger.Ledger
}

// newProcessor opens the bbolt ledger of s (s.sql is nil).
func newProcessor(s settings, mgr *service.Resources) (*processor, error) {
	if err := os.MkdirAll(filepath.Dir(s.path), 0o755); err != nil {
		return nil, fmt.Errorf("creating the directory of dedup ledger %s: %w", s.path, err)
	}
	l, err := ledger.Open(s.path, ledger.Options{Retention: s.retention, Verify: s.verify, AcceptRollback: s.rollback})
	if err != nil {
		return nil, err
	}
	p := &processor{common: newCommon(s, mgr), l: l}
	p.gate.Store = dedup.Bolt(l)
	p.gate.OnCommit = p.countKeys
	p.countKeys()
	return p, nil
}

// countKeys refreshes the key gauge and adds what bbolt wrote since the
// last call to the written-bytes counter.
func (p *processor) countKeys() {
	p.m.keys.Set(p.l.Stats().Keys)
	if n := p.l.TakeWritten(); n > 0 {
		p.m.written.Incr(n)
	}
}

// ProcessBatch checks every message of the batch against the ledger.
func (p *processor) ProcessBatch(ctx context.Context, batch service.MessageBatch) ([]service.MessageBatch, error) {
	out := p.check(ctx, batch)
	p.countKeys()
	return batchOf(out), nil
}

// Close releases this thread's share of the ledger; the ledger bounds its
// own wait too.
func (p *processor) Close(ctx context.Context) error {
	return p.closeOnceWithin(ctx, shutdown.Outer(shutdown.Commit), "dedup ledger "+p.l.Path(), p.l.Close)
}

// common is what the bbolt and the SQL processor share: the settings, the
// gate that decides each copy's fate, how a message's key is evaluated,
// what happens to a copy that does not pass (duplicate, conflict, failure)
// with its metrics, and a bounded Close.
type common struct {
	s    settings
	log  *service.Logger
	m    *metrics
	gate dedup.Gate // Store set by the constructor

	closeOnce sync.Once // Benthos may call Close more than once
	closeErr  error
}

func newCommon(s settings, mgr *service.Resources) common {
	m := newMetrics(mgr, s)
	return common{s: s, log: mgr.Logger(), m: m, gate: dedup.Gate{
		Wait: s.waitTimeout, Immediate: s.immediate,
		Passed: m.passed, Commits: m.commits, Releases: m.releases,
	}}
}

// check decides the fate of every message of the batch through the gate:
// copies of applied keys are dropped or flagged, the others pass claimed.
func (c *common) check(ctx context.Context, batch service.MessageBatch) service.MessageBatch {
	out := make(service.MessageBatch, 0, len(batch))
	b := c.gate.Batch()
	for i, msg := range batch {
		key, hash, err := c.keyOf(batch, i)
		d := c.gate.Fail(err)
		if err == nil {
			d = b.Check(ctx, key, hash, commit.HooksFrom(msg.Context()))
		}
		if m := c.decide(msg, key, d); m != nil {
			out = append(out, m)
		}
	}
	return out
}

// decide maps d onto msg: it passes (perhaps flagged), fails, or is
// dropped (nil).
func (c *common) decide(msg *service.Message, key claims.Key, d dedup.Decision) *service.Message {
	if d.Join != nil {
		msg = msg.WithContext(commit.WithParticipant(msg.Context(), *d.Join))
	}
	switch {
	case d.Err != nil:
		return c.fail(msg, d.Err)
	case d.Verdict == claims.Duplicate:
		return c.duplicate(msg, key)
	case d.Verdict == claims.Conflict:
		return c.conflict(msg, key)
	}
	return msg
}

// keyOf evaluates the key of message i and hashes its payload.
func (c *common) keyOf(batch service.MessageBatch, i int) (key claims.Key, hash [32]byte, err error) {
	id, err := batch.TryInterpolatedString(i, c.s.key)
	if err != nil {
		return key, hash, fmt.Errorf("dedup_ledger: evaluating key: %w", err)
	}
	var ns string
	if c.s.namespace != nil {
		if ns, err = batch.TryInterpolatedString(i, c.s.namespace); err != nil {
			return key, hash, fmt.Errorf("dedup_ledger: evaluating namespace of key %q: %w", id, err)
		}
	}
	if key, err = dedup.NewKey(ns, id); err != nil {
		return key, hash, err
	}
	payload, err := batch[i].AsBytes()
	if err != nil {
		return key, hash, fmt.Errorf("dedup key %s: reading payload: %w", key, err)
	}
	return key, dedup.Hash(payload), nil
}

// duplicate counts a copy of an applied key and drops it (nil), or with
// on_duplicate: flag passes it with metadata dedup_duplicate.
func (c *common) duplicate(msg *service.Message, key claims.Key) *service.Message {
	c.m.duplicates.Incr(1)
	tracing.SetOutcome(msg.Context(), tracing.DuplicateDrop, nil)
	if !c.s.flag {
		c.log.Debugf("Skipping duplicate of dedup key %s: dropped", key)
		return nil
	}
	msg.MetaSetMut(metaDuplicate, true)
	return msg
}

// conflict flags a copy whose payload differs from the applied one.
func (c *common) conflict(msg *service.Message, key claims.Key) *service.Message {
	c.m.conflicts.Incr(1)
	note := ""
	if c.s.sql != nil && len(c.s.sql.apply) > 0 {
		note = " (its apply statements did not run)"
	}
	c.log.Warnf("Dedup key %s is already applied with a different payload: the producer reused an event ID. Passing the message with metadata %s: true%s", key, metaConflict, note)
	msg.MetaSetMut(metaConflict, true)
	return msg
}

// fail flags msg with err, like any processor error.
func (c *common) fail(msg *service.Message, err error) *service.Message {
	c.m.errors.Incr(1)
	c.log.Errorf("%v", err)
	msg.SetError(err)
	return msg
}

// closeOnceWithin runs release once, bounded by the shutdown convention.
func (c *common) closeOnceWithin(ctx context.Context, limit time.Duration, what string, release func() error) error {
	c.closeOnce.Do(func() { c.closeErr = shutdown.Within(ctx, limit, what, release) })
	return c.closeErr
}

// batchOf returns out as the processor's result (none when empty).
func batchOf(out service.MessageBatch) []service.MessageBatch {
	if len(out) == 0 {
		return nil
	}
	return []service.MessageBatch{out}
}
