package ledger

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/sqlledger"
)

// sharedStore is one SQL ledger table used by every dedup_ledger thread (and
// every processor) of this process that names it. Sharing matters: the
// in-process claims must be one map, and SQLite wants one writer pool.
//
// Its workers group concurrent requests into transactions. A request is
// answered only after its transaction committed or failed, so a message
// never moves on before its effect (or its key) is durable.
type sharedStore struct {
	id       string
	settings string // what every processor sharing the store must agree on
	store    *sqlledger.Store
	reqs     chan *sqlReq
	max      int // requests per transaction

	mu     sync.Mutex
	claims map[sqlledger.Key]*sqlClaim
	refs   int

	stop    context.CancelFunc
	ctx     context.Context // ends when the last user closes
	workers sync.WaitGroup
}

// sqlReq is one message's work for a worker: apply (entry with statements)
// or record (the key only, its effect committed elsewhere).
type sqlReq struct {
	entry  sqlledger.Entry
	record bool
	done   chan sqlledger.Outcome // buffered 1
}

var (
	storesMu sync.Mutex
	stores   = map[string]*sharedStore{}
)

// openShared returns the process's handle on the table, opening it (and
// running init) on first use. Every call needs a release.
func openShared(ctx context.Context, s *sqlSettings, retention time.Duration, onKeys func(int64), logf func(string, ...any)) (*sharedStore, error) {
	id := string(s.cfg.Driver) + "\x00" + s.cfg.DSN + "\x00" + s.cfg.Table
	// The first processor's pool, batching, retention and init statements
	// serve them all, so a second one must not expect others.
	settings := fmt.Sprintf("%+v|%d|%s|%q", s.cfg, s.maxBatch, retention, s.init)
	storesMu.Lock()
	defer storesMu.Unlock()
	if sh := stores[id]; sh != nil {
		if sh.settings != settings {
			return nil, fmt.Errorf("dedup_ledger: another dedup_ledger in this process already uses table %q of this %s database with different settings (pool, max_batch, retention or init_statements); give both the same settings or use another table", s.cfg.Table, s.cfg.Driver)
		}
		sh.mu.Lock()
		sh.refs++
		sh.mu.Unlock()
		return sh, nil
	}
	st, err := sqlledger.Open(ctx, s.cfg)
	if err != nil {
		return nil, fmt.Errorf("dedup_ledger: %w", err)
	}
	for i, q := range s.init {
		if _, err := st.DB().ExecContext(ctx, q); err != nil {
			st.Close()
			return nil, fmt.Errorf("dedup_ledger: sql.init_statements[%d] (%q) failed: %w", i, q, err)
		}
	}
	wctx, stop := context.WithCancel(context.Background())
	sh := &sharedStore{
		id: id, settings: settings, store: st, reqs: make(chan *sqlReq, 4*s.maxBatch), max: s.maxBatch,
		claims: map[sqlledger.Key]*sqlClaim{}, refs: 1, ctx: wctx, stop: stop,
	}
	// One worker per connection: more could only queue for a connection.
	workers := st.DB().Stats().MaxOpenConnections
	if workers <= 0 {
		workers = 8
	}
	for range workers {
		sh.workers.Add(1)
		go sh.work()
	}
	if retention > 0 {
		sh.workers.Add(1)
		go sh.expireLoop(retention, onKeys, logf)
	}
	stores[id] = sh
	return sh, nil
}

// release drops one reference; the last one stops the workers (bounded)
// and closes the pool.
func (sh *sharedStore) release() error {
	storesMu.Lock()
	sh.mu.Lock()
	sh.refs--
	last := sh.refs == 0
	sh.mu.Unlock()
	if last {
		delete(stores, sh.id)
	}
	storesMu.Unlock()
	if !last {
		return nil
	}
	sh.stop()
	done := make(chan struct{})
	go func() { sh.workers.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		return errors.New("dedup_ledger: closing the SQL ledger: transactions still running after 15s")
	}
	return sh.store.Close()
}

// submit queues a request; the answer arrives on req.done.
func (sh *sharedStore) submit(ctx context.Context, req *sqlReq) error {
	select {
	case sh.reqs <- req:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-sh.ctx.Done():
		return errors.New("dedup_ledger: the SQL ledger is closing")
	}
}

// do submits one request and waits for its outcome.
func (sh *sharedStore) do(ctx context.Context, req *sqlReq) sqlledger.Outcome {
	if err := sh.submit(ctx, req); err != nil {
		return sqlledger.Outcome{Err: err}
	}
	return sh.wait(ctx, req)
}

// wait returns the outcome of a submitted request. If ctx ends first the
// message fails; the transaction may still commit, and then the
// redelivered copy finds the ledger row.
func (sh *sharedStore) wait(ctx context.Context, req *sqlReq) sqlledger.Outcome {
	select {
	case o := <-req.done:
		return o
	case <-ctx.Done():
		return sqlledger.Outcome{Err: fmt.Errorf("gave up waiting for the transaction of %s: %w (if it commits, the redelivered copy is recognised)", req.entry.Key, ctx.Err())}
	case <-sh.ctx.Done():
		// Closing: the workers may be gone. Failing is safe for the same
		// reason as above.
		select {
		case o := <-req.done:
			return o
		default:
			return sqlledger.Outcome{Err: fmt.Errorf("the SQL ledger closed before the transaction of %s finished (if it committed, the redelivered copy is recognised)", req.entry.Key)}
		}
	}
}

// work takes whatever requests are queued (up to max) and runs them as one
// transaction.
func (sh *sharedStore) work() {
	defer sh.workers.Done()
	for {
		var batch []*sqlReq
		select {
		case <-sh.ctx.Done():
			return
		case r := <-sh.reqs:
			batch = append(batch, r)
		}
	fill:
		for len(batch) < sh.max {
			select {
			case r := <-sh.reqs:
				batch = append(batch, r)
			default:
				break fill
			}
		}
		sh.run(batch)
	}
}

// run commits one group: records first (one multi-row transaction), then
// applies (one transaction, a savepoint each).
func (sh *sharedStore) run(batch []*sqlReq) {
	// The requests' own contexts may end while we work; the transaction is
	// bounded by the store's retries and stopped only at close.
	ctx := sh.ctx
	var records, applies []*sqlReq
	for _, r := range batch {
		if r.record {
			records = append(records, r)
		} else {
			applies = append(applies, r)
		}
	}
	if len(records) > 0 {
		keys := make([]sqlledger.Key, len(records))
		hashes := make([][]byte, len(records))
		for i, r := range records {
			keys[i], hashes[i] = r.entry.Key, r.entry.Hash
		}
		ins, err := sh.store.Record(ctx, keys, hashes)
		for i, r := range records {
			if err != nil {
				r.done <- sqlledger.Outcome{Err: err}
			} else {
				r.done <- sqlledger.Outcome{Result: sqlledger.Result{Inserted: ins[i]}}
			}
		}
	}
	switch len(applies) {
	case 0:
	case 1:
		r := applies[0]
		res, err := sh.store.Apply(ctx, r.entry.Key, r.entry.Hash, r.entry.Stmts)
		r.done <- sqlledger.Outcome{Result: res, Err: err}
	default:
		entries := make([]sqlledger.Entry, len(applies))
		for i, r := range applies {
			entries[i] = r.entry
		}
		outs, err := sh.store.ApplyBatch(ctx, entries)
		for i, r := range applies {
			if err != nil {
				r.done <- sqlledger.Outcome{Err: err}
			} else {
				r.done <- outs[i]
			}
		}
	}
}

// expireLoop deletes rows older than retention now and then, in small
// batches, and reports the row count.
func (sh *sharedStore) expireLoop(retention time.Duration, onKeys func(int64), logf func(string, ...any)) {
	defer sh.workers.Done()
	every := min(max(retention/4, time.Second), time.Minute)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		cutoff := time.Now().Add(-retention)
		for range 64 { // bounded per round; the next tick continues
			n, err := sh.store.Expire(sh.ctx, cutoff, sqlledger.DefaultExpireLimit)
			if err != nil {
				if sh.ctx.Err() == nil {
					logf("dedup_ledger: expiring old keys: %v", err)
				}
				break
			}
			if n < sqlledger.DefaultExpireLimit {
				break
			}
		}
		if n, err := sh.store.Count(sh.ctx); err == nil {
			onKeys(n)
		}
		select {
		case <-sh.ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sqlClaim is an in-process claim on a key that is not in the table yet,
// held by the one message copy that passed, until its hook records the key
// or releases it. It stops a second local copy from passing meanwhile.
// (Copies at other processes are not seen: without apply, two instances
// can both pass one key at the same instant; see the docs.)
type sqlClaim struct {
	sh   *sharedStore
	key  sqlledger.Key
	once sync.Once
	done chan struct{} // closed when settled
}

// errSQLInFlight: another copy of the key held its claim past wait_timeout.
var errSQLInFlight = errors.New("another copy of this key is still in flight")

// claim returns a claim on key, or the verdict that key is applied
// (duplicate, or conflict when its hash differs). It waits up to wait for
// a local copy in flight.
func (sh *sharedStore) claim(ctx context.Context, key sqlledger.Key, hash []byte, wait time.Duration) (*sqlClaim, verdict, error) {
	var timeout <-chan time.Time // started only if a copy is in flight
	for {
		sh.mu.Lock()
		other := sh.claims[key]
		if other == nil {
			c := &sqlClaim{sh: sh, key: key, done: make(chan struct{})}
			sh.claims[key] = c
			sh.mu.Unlock()
			stored, found, err := sh.store.Lookup(ctx, key)
			if err != nil || found {
				c.settle()
			}
			switch {
			case err != nil:
				return nil, 0, err
			case found && len(stored) > 0 && string(stored) != string(hash):
				return nil, verdictConflict, nil
			case found:
				return nil, verdictDuplicate, nil
			}
			return c, verdictNew, nil
		}
		sh.mu.Unlock()
		if timeout == nil {
			t := time.NewTimer(wait)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-other.done: // committed or released: look again
		case <-timeout:
			return nil, 0, fmt.Errorf("dedup key %s: %w after %s; the message fails and is retried", key, errSQLInFlight, wait)
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		}
	}
}

// settle ends the claim (after the key was recorded, or to release it);
// waiters then look the key up again.
func (c *sqlClaim) settle() {
	c.once.Do(func() {
		c.sh.mu.Lock()
		if c.sh.claims[c.key] == c {
			delete(c.sh.claims, c.key)
		}
		c.sh.mu.Unlock()
		close(c.done)
	})
}

type verdict int

const (
	verdictNew verdict = iota
	verdictDuplicate
	verdictConflict
)
