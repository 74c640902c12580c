package ledger

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/boltfile"
	"github.com/reliable-mqtt/reliable-mqtt/internal/commit"
	"github.com/reliable-mqtt/reliable-mqtt/internal/ledger"
	"github.com/reliable-mqtt/reliable-mqtt/internal/shutdown"
)

// processor is one pipeline thread's dedup_ledger. Benthos builds one per
// thread; they share the file's *ledger.Ledger and so its claims.
type processor struct {
	common
	l *ledger.Ledger
}

func newProcessor(conf *service.ParsedConfig, mgr *service.Resources) (*processor, error) {
	s, err := parseSettings(conf)
	if err != nil {
		return nil, err
	}
	if s.sql != nil {
		return nil, errors.New("dedup_ledger: internal error: the bbolt processor was given an sql config")
	}
	if err := os.MkdirAll(filepath.Dir(s.path), 0o755); err != nil {
		return nil, fmt.Errorf("creating the directory of dedup ledger %s: %w", s.path, err)
	}
	l, err := ledger.Open(s.path, ledger.Options{Retention: s.retention, Verify: s.verify, AcceptRollback: s.rollback})
	if err != nil {
		return nil, err
	}
	p := &processor{common: common{s: s, log: mgr.Logger(), m: newMetrics(mgr, s)}, l: l}
	p.m.keys.Set(l.Stats().Keys)
	return p, nil
}

func parseSettings(conf *service.ParsedConfig) (s settings, err error) {
	// Exactly one store: a bbolt file or an SQL database.
	hasPath, hasSQL := conf.Contains(fieldPath), conf.Contains(fieldSQL)
	switch {
	case hasPath && hasSQL:
		return s, errors.New("dedup_ledger: set either path (a bbolt file) or sql (a database), not both")
	case !hasPath && !hasSQL:
		return s, errors.New("dedup_ledger: no ledger store: set path (a bbolt file; use the outbox.path of the reliable_mqtt_out that follows) or sql (a SQLite or PostgreSQL database)")
	case hasPath:
		if s.path, err = conf.FieldString(fieldPath); err != nil {
			return s, err
		}
		if s.path == "" {
			return s, errors.New("path is empty: give the bbolt file of the dedup ledger (use the outbox.path of the reliable_mqtt_out that follows), or use sql instead")
		}
	default:
		if s.sql, err = parseSQLSettings(conf.Namespace(fieldSQL)); err != nil {
			return s, err
		}
	}
	if s.key, err = conf.FieldInterpolatedString(fieldKey); err != nil {
		return s, err
	}
	if raw, _ := conf.FieldString(fieldNamespace); raw != "" {
		if s.namespace, err = conf.FieldInterpolatedString(fieldNamespace); err != nil {
			return s, err
		}
	}
	dup, err := conf.FieldString(fieldOnDuplicate)
	if err != nil {
		return s, err
	}
	if dup != duplicateDrop && dup != duplicateFlag {
		return s, fmt.Errorf("on_duplicate must be %q or %q, got %q", duplicateDrop, duplicateFlag, dup)
	}
	s.flag = dup == duplicateFlag
	if s.retention, err = conf.FieldDuration(fieldRetention); err != nil {
		return s, err
	}
	if s.retention < 0 {
		return s, fmt.Errorf("retention must not be negative, got %s", s.retention)
	}
	mode, err := conf.FieldString(fieldCommit)
	if err != nil {
		return s, err
	}
	if mode != commitAuto && mode != commitImmediate {
		return s, fmt.Errorf("commit must be %q or %q, got %q", commitAuto, commitImmediate, mode)
	}
	s.immediate = mode == commitImmediate
	if s.waitTimeout, err = conf.FieldDuration(fieldWaitTimeout); err != nil {
		return s, err
	}
	if s.waitTimeout <= 0 {
		return s, fmt.Errorf("wait_timeout must be positive, got %s", s.waitTimeout)
	}
	verify, err := conf.FieldString(fieldVerify)
	if err != nil {
		return s, err
	}
	if s.verify, err = boltfile.ParseVerify(verify); err != nil {
		return s, err
	}
	if s.rollback, err = conf.FieldBool(fieldRollback); err != nil {
		return s, err
	}
	return s, nil
}

// errNoCommitPath explains what commit: auto needs.
var errNoCommitPath = errors.New("dedup_ledger (commit: auto) cannot record this message's key: it did not come from reliable_mqtt_in, so nothing tells the ledger when its effect is committed. " +
	"Read it with reliable_mqtt_in (the key is then committed with the outbox record of a reliable_mqtt_out on the same file, or when the pipeline acknowledges the message), " +
	"or set commit: immediate to record keys before the output runs (like Benthos's dedupe: a failed output then loses the message)")

// ProcessBatch checks every message of the batch against the ledger.
func (p *processor) ProcessBatch(ctx context.Context, batch service.MessageBatch) ([]service.MessageBatch, error) {
	out := make(service.MessageBatch, 0, len(batch))
	inBatch := map[ledger.Key][32]byte{} // passed keys and their hashes
	for i, msg := range batch {
		ns, id, err := p.keyOf(batch, i)
		if err != nil {
			out = append(out, p.fail(msg, err))
			continue
		}
		key := ledger.Key{Namespace: ns, ID: id}
		hash, err := hashOf(msg, key)
		if err != nil {
			out = append(out, p.fail(msg, err))
			continue
		}

		// A copy of a key an earlier message of this batch claimed: the
		// batch is acknowledged or retried as one, so waiting for that
		// claim would wait for ourselves.
		if earlier, ok := inBatch[key]; ok {
			if earlier != hash {
				out = append(out, p.conflict(msg, key))
			} else if m := p.duplicate(msg, key, hash); m != nil {
				out = append(out, m)
			}
			continue
		}

		claim, verdict, err := p.l.Claim(ctx, key, hash, p.s.waitTimeout)
		if err != nil {
			out = append(out, p.fail(msg, err))
			continue
		}
		switch verdict {
		case ledger.Duplicate:
			if m := p.duplicate(msg, key, hash); m != nil {
				out = append(out, m)
			}
			continue
		case ledger.Conflict:
			out = append(out, p.conflict(msg, key))
			continue
		}
		m, err := p.pass(ctx, msg, claim)
		if err != nil {
			claim.Release()
			p.m.releases.Incr(1)
			out = append(out, p.fail(msg, err))
			continue
		}
		inBatch[key] = hash
		out = append(out, m)
	}
	p.m.keys.Set(p.l.Stats().Keys)
	if len(out) == 0 {
		return nil, nil
	}
	return []service.MessageBatch{out}, nil
}

// pass lets a claimed message through and arranges for its key to be
// recorded when its effect commits.
func (p *processor) pass(ctx context.Context, msg *service.Message, claim *ledger.Claim) (*service.Message, error) {
	if p.s.immediate {
		if err := claim.Commit(ctx); err != nil {
			return nil, err
		}
		p.m.commits.Incr(1)
		p.m.passed.Incr(1)
		return msg, nil
	}
	hooks := commit.HooksFrom(msg.Context())
	if hooks == nil {
		return nil, fmt.Errorf("dedup key %s: %w", claim.Key(), errNoCommitPath)
	}
	if err := hooks.Register(p.onDelivered(claim)); err != nil {
		return nil, fmt.Errorf("dedup key %s: %w", claim.Key(), err)
	}
	ctx2 := commit.WithParticipant(msg.Context(), claim.Participant())
	p.m.passed.Incr(1)
	return msg.WithContext(ctx2), nil
}

// onDelivered is the delivery hook of a passed message: it runs once with
// the pipeline's final result, before the input acknowledges the source.
func (p *processor) onDelivered(claim *ledger.Claim) commit.DeliveryHook {
	return func(ctx context.Context, result error) error {
		if result != nil {
			// Nothing to do if an output on our file already committed the
			// key with its record: that effect is durable.
			if claim.Release() {
				p.m.releases.Incr(1)
			} else if claim.Committed() {
				p.m.commits.Incr(1)
			}
			return nil
		}
		if err := claim.Commit(ctx); err != nil {
			if claim.Release() {
				p.m.releases.Incr(1)
			}
			// Failing the hook keeps the source unacknowledged: the broker
			// redelivers and the copy passes again.
			return fmt.Errorf("dedup_ledger: recording key %s in %s failed, the message is not acknowledged and will be redelivered: %w", claim.Key(), p.l.Path(), err)
		}
		p.m.commits.Incr(1)
		p.m.keys.Set(p.l.Stats().Keys)
		return nil
	}
}

// duplicate drops msg, or flags it; a flagged copy carries a participant
// that stops a writer on the ledger's file from storing it again.
func (p *processor) duplicate(msg *service.Message, key ledger.Key, hash [32]byte) *service.Message {
	if p.s.flag {
		msg = msg.WithContext(commit.WithParticipant(msg.Context(), p.l.SkipParticipant(key, hash)))
	}
	return p.common.duplicate(msg, key)
}

// fail flags msg with err, and makes a writer on the ledger's file refuse
// it, so a message the ledger could not check is never enqueued unchecked.
func (p *processor) fail(msg *service.Message, err error) *service.Message {
	msg = msg.WithContext(commit.WithParticipant(msg.Context(), p.l.RefuseParticipant(err)))
	return p.common.fail(msg, err)
}

// Close releases this thread's share of the ledger; the ledger bounds its
// own wait too.
func (p *processor) Close(ctx context.Context) error {
	return p.closeOnceWithin(ctx, shutdown.Outer(shutdown.Commit), "dedup ledger "+p.l.Path(), p.l.Close)
}
