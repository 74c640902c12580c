package sqlledger

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/claims"
	"github.com/reliable-mqtt/reliable-mqtt/internal/groupcommit"
	"github.com/reliable-mqtt/reliable-mqtt/internal/ledgerclock"
	"github.com/reliable-mqtt/reliable-mqtt/internal/registry"
	"github.com/reliable-mqtt/reliable-mqtt/internal/shutdown"
)

// Pool is one SQL ledger table used by every dedup_ledger thread (and
// every processor) of this process that names it. Sharing matters: the
// in-process claims must be one map, and SQLite wants one writer pool.
//
// Its workers (one groupcommit loop per connection) group concurrent
// requests into transactions. A request is
// answered only after its transaction committed or failed, so a message
// never moves on before its effect (or its key) is durable.
type Pool struct {
	id       string
	settings string // what every processor sharing the store must agree on
	store    *Store
	reqs     chan *Request
	max      int // requests per transaction

	claims *claims.Table // never closed: the pool's users are gone when it closes

	stop    context.CancelFunc
	ctx     context.Context // ends when the last user closes
	workers sync.WaitGroup
}

// Request is one message's work for a worker: apply (entry with statements)
// or record (the key only, its effect committed elsewhere).
type Request struct {
	entry  Entry
	record bool
	done   chan Outcome // buffered 1
}

// NewRequest returns the work of one message: with record, the key only
// (its effect is committed elsewhere); otherwise the key and the entry's
// statements in one transaction.
func NewRequest(entry Entry, record bool) *Request {
	return &Request{entry: entry, record: record, done: make(chan Outcome, 1)}
}

// Entry returns what the request carries.
func (r *Request) Entry() Entry { return r.entry }

// pools holds the process's pools by driver, DSN and table.
var pools registry.Registry[*Pool]

// PoolConfig is what OpenPool needs besides the connection.
type PoolConfig struct {
	Config
	Init      []string      // statements run once when the pool opens
	MaxBatch  int           // requests per transaction
	Retention time.Duration // 0: keys are kept
	OnKeys    func(int64)   // the row count, after each expiry round
	Logf      func(string, ...any)
	// StartupWait bounds how long OpenPool waits for a read-write server
	// (PostgreSQL: refused, starting, or only a standby so far); 0 waits
	// until one answers or ctx ends.
	StartupWait time.Duration
}

// OpenPool returns the process's handle on the table, opening it (and
// running init) on first use. Every call needs a Release.
func OpenPool(ctx context.Context, pc PoolConfig) (*Pool, error) {
	id := string(pc.Config.Driver) + "\x00" + pc.Config.DSN + "\x00" + pc.Config.Table
	// The first processor's pool, batching, retention and init statements
	// serve them all, so a second one must not expect others.
	c := pc.Config
	c.Logf, c.OnRetry, c.OnAvailable, c.Clock = nil, nil, nil, ledgerclock.Source{} // a function prints as its address
	settings := fmt.Sprintf("%+v|%d|%s|%q", c, pc.MaxBatch, pc.Retention, pc.Init)
	join := func(sh *Pool) error {
		if sh.settings != settings {
			return fmt.Errorf("dedup_ledger: another dedup_ledger in this process already uses table %q of this %s database with different settings (pool, max_batch, retention or init_statements); give both the same settings or use another table", pc.Config.Table, pc.Config.Driver)
		}
		return nil
	}
	return pools.Acquire(id, join, func() (*Pool, error) { return openPool(ctx, id, settings, pc) })
}

// openPool opens the table, runs init and starts the workers.
func openPool(ctx context.Context, id, settings string, pc PoolConfig) (*Pool, error) {
	st, err := openWaiting(ctx, pc)
	if err != nil {
		return nil, err
	}
	wctx, stop := context.WithCancel(context.Background())
	sh := &Pool{
		id: id, settings: settings, store: st, reqs: make(chan *Request, 4*pc.MaxBatch), max: pc.MaxBatch,
		claims: claims.New(nil), ctx: wctx, stop: stop,
	}
	workers := transactionsAtOnce(st.DB().Stats().MaxOpenConnections)
	for range workers {
		sh.workers.Add(1)
		go sh.work()
	}
	sh.workers.Add(1)
	go sh.expireLoop(pc.Retention, pc.OnKeys, pc.Logf)
	return sh, nil
}

// transactionsAtOnce is how many workers (group transactions at once) a
// pool of conns connections runs: one connection stays free for what does
// not go through a worker (look-ups of claims, expiry, counts), so the
// default of two runs one transaction at a time. More transactions at once
// only split the same in-flight messages into smaller groups, and each
// group pays its round trips and commit (CPU at both ends, per group)
// whatever its size: with one worker, the messages that arrive while a
// group commits all form the next one.
func transactionsAtOnce(conns int) int {
	if conns <= 0 {
		return 8 // unlimited connections: database/sql's 0
	}
	return max(1, conns-1)
}

// Backoff between start-up attempts while no read-write server answers.
const (
	startBackoffInitial = 250 * time.Millisecond
	startBackoffMax     = 5 * time.Second
)

// openWaiting opens the store and runs init, again and again while the
// database is unavailable (see Store.IsUnavailable): a consumer started
// during a failover waits for the promoted primary instead of exiting.
// Each attempt is bounded by ConnectTimeout; the whole wait by
// StartupWait (if set) and ctx. Any other error is returned at once: no
// retry fixes a bad DSN, a wrong password or a failing init statement.
func openWaiting(ctx context.Context, pc PoolConfig) (*Store, error) {
	if pc.StartupWait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, pc.StartupWait)
		defer cancel()
	}
	pc.Config.Logf = pc.Logf
	began, wait, logged := time.Now(), startBackoffInitial, time.Time{}
	for attempt := 1; ; attempt++ {
		st, err := openOnce(ctx, pc)
		if err == nil {
			if attempt > 1 {
				logf(pc.Logf, "dedup_ledger: %s database %s answered after %d attempts in %s", pc.Driver, redactDSN(pc.DSN), attempt, time.Since(began).Round(time.Millisecond))
			}
			return st, nil
		}
		d := dialects[pc.Driver]
		if d == nil || !d.unavailable(err) {
			return nil, err
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w; gave up waiting for a read-write server after %d attempts in %s", err, attempt, time.Since(began).Round(time.Millisecond))
		}
		if time.Since(logged) >= downLogEvery {
			logged = time.Now()
			logf(pc.Logf, "%v; waiting for a read-write server (attempt %d, next in %s); no message is processed until then", err, attempt, wait)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
		wait = min(2*wait, startBackoffMax)
	}
}

// openOnce is one start-up attempt: the store, then init.
func openOnce(ctx context.Context, pc PoolConfig) (*Store, error) {
	st, err := Open(ctx, pc.Config)
	if err != nil {
		return nil, fmt.Errorf("dedup_ledger: %w", err)
	}
	for i, q := range pc.Init {
		if err := st.ExecSetup(ctx, q); err != nil {
			st.Close()
			return nil, fmt.Errorf("dedup_ledger: sql.init_statements[%d] (%q) failed: %w", i, q, err)
		}
	}
	return st, nil
}

func logf(f func(string, ...any), format string, args ...any) {
	if f != nil {
		f(format, args...)
	}
}

// releaseTimeout bounds the wait for transactions in progress: a commit,
// plus a retry's backoff.
var releaseTimeout = shutdown.Outer(shutdown.Commit)

// Release drops one reference; the last one stops the workers (bounded)
// and closes the pool.
func (sh *Pool) Release() error {
	if !pools.Release(sh.id, sh) {
		return nil
	}
	sh.stop()
	if !shutdown.Wait(releaseTimeout, shutdown.Go(sh.workers.Wait)) {
		return fmt.Errorf("dedup_ledger: closing the SQL ledger: transactions still running after %s", releaseTimeout)
	}
	return sh.store.Close()
}

// submit queues a request; the answer arrives on req.done.
func (sh *Pool) Submit(ctx context.Context, req *Request) error {
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
func (sh *Pool) Do(ctx context.Context, req *Request) Outcome {
	if err := sh.Submit(ctx, req); err != nil {
		return Outcome{Err: err}
	}
	return sh.Wait(ctx, req)
}

// wait returns the outcome of a submitted request. If ctx ends first the
// message fails; the transaction may still commit, and then the
// redelivered copy finds the ledger row.
func (sh *Pool) Wait(ctx context.Context, req *Request) Outcome {
	select {
	case o := <-req.done:
		return o
	case <-ctx.Done():
		return Outcome{Err: fmt.Errorf("gave up waiting for the transaction of %s: %w (if it commits, the redelivered copy is recognised)", req.entry.Key, ctx.Err())}
	case <-sh.ctx.Done():
		// Closing: the workers may be gone. Failing is safe for the same
		// reason as above.
		select {
		case o := <-req.done:
			return o
		default:
			return Outcome{Err: fmt.Errorf("the SQL ledger closed before the transaction of %s finished (if it committed, the redelivered copy is recognised)", req.entry.Key)}
		}
	}
}

// work is one connection's groupcommit loop: whatever requests are queued
// (up to max) run as one group. A request still queued at close is failed
// by Wait.
func (sh *Pool) work() {
	defer sh.workers.Done()
	groupcommit.Run(sh.reqs, sh.ctx.Done(), sh.max, sh.run)
}

// run commits one group: records first (one multi-row transaction), then
// applies (one transaction, a savepoint each).
func (sh *Pool) run(batch []*Request) {
	// The requests' own contexts may end while we work; the transaction is
	// bounded by the store's retries and stopped only at close.
	ctx := sh.ctx
	var records, applies []*Request
	for _, r := range batch {
		if r.record {
			records = append(records, r)
		} else {
			applies = append(applies, r)
		}
	}
	if len(records) > 0 {
		keys := make([]claims.Key, len(records))
		hashes := make([][]byte, len(records))
		for i, r := range records {
			keys[i], hashes[i] = r.entry.Key, r.entry.Hash
		}
		ins, err := sh.store.Record(ctx, keys, hashes)
		for i, r := range records {
			if err != nil {
				r.done <- Outcome{Err: err}
			} else {
				r.done <- Outcome{Result: Result{Inserted: ins[i]}}
			}
		}
	}
	switch {
	case len(applies) == 0:
	case len(applies) == 1 && !sh.store.d.batchOne:
		r := applies[0]
		res, err := sh.store.Apply(ctx, r.entry.Key, r.entry.Hash, r.entry.Stmts)
		r.done <- Outcome{Result: res, Err: err}
	default:
		entries := make([]Entry, len(applies))
		for i, r := range applies {
			entries[i] = r.entry
		}
		outs, err := sh.store.ApplyBatch(ctx, entries)
		for i, r := range applies {
			if err != nil {
				r.done <- Outcome{Err: err}
			} else {
				r.done <- outs[i]
			}
		}
	}
}

// expireLoop advances the table's ledger clock (clock.go) now and then
// and, with a retention, deletes the rows past it in small batches and
// reports the row count.
func (sh *Pool) expireLoop(retention time.Duration, onKeys func(int64), log func(string, ...any)) {
	defer sh.workers.Done()
	every := time.Minute
	if retention > 0 {
		every = min(max(retention/4, time.Second), time.Minute)
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		// Twice the tick: a late tick still counts all its time.
		cutoff, due, err := sh.store.ExpireDue(sh.ctx, retention, 2*every)
		if err != nil && sh.ctx.Err() == nil {
			logf(log, "dedup_ledger: %v", err)
		}
		for range 64 { // bounded per round; the next tick continues
			if !due || retention <= 0 {
				break
			}
			n, err := sh.store.Expire(sh.ctx, cutoff, DefaultExpireLimit)
			if err != nil {
				if sh.ctx.Err() == nil {
					logf(log, "dedup_ledger: expiring old keys: %v", err)
				}
				break
			}
			if n < DefaultExpireLimit {
				break
			}
		}
		if onKeys != nil && retention > 0 {
			if n, err := sh.store.Count(sh.ctx); err == nil {
				onKeys(n)
			}
		}
		select {
		case <-sh.ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Claim is an in-process claim on a key that is not in the table yet,
// held by the one message copy that passed, until the key is recorded
// (Commit) or given up (Release). It stops a second local copy from
// passing meanwhile. (Copies at other processes are not seen: without
// apply, two instances can both pass one key at the same instant; see the
// docs.)
type Claim struct {
	pool *Pool
	key  claims.Key
	hash []byte
	hold *claims.Hold
}

// Claim returns a claim on key, or the verdict that key is applied
// (duplicate, or conflict when its hash differs). It waits up to wait for
// a local copy in flight.
func (sh *Pool) Claim(ctx context.Context, key claims.Key, hash []byte, wait time.Duration) (*Claim, claims.Verdict, error) {
	hold, err := sh.claims.Take(ctx, strconv.Itoa(len(key.Namespace))+":"+key.Namespace+key.ID, wait)
	switch {
	case errors.Is(err, claims.ErrInFlight):
		return nil, 0, fmt.Errorf("dedup key %s: %w after %s; the message fails and is retried", key, claims.ErrInFlight, wait)
	case err != nil:
		return nil, 0, err
	}
	c := &Claim{pool: sh, key: key, hash: hash, hold: hold}
	stored, found, err := sh.store.Lookup(ctx, key)
	if err != nil || found {
		c.Release()
	}
	switch {
	case err != nil:
		return nil, 0, err
	case found && len(stored) > 0 && string(stored) != string(hash):
		return nil, claims.Conflict, nil
	case found:
		return nil, claims.Duplicate, nil
	}
	return c, claims.Pass, nil
}

// Key returns the claimed key.
func (c *Claim) Key() claims.Key { return c.key }

// Commit records the key (its effect was committed elsewhere) in the
// pool's next group transaction and returns once that committed; the
// claim then ends. On error the claim is still held.
func (c *Claim) Commit(ctx context.Context) error {
	if o := c.pool.Do(ctx, NewRequest(Entry{Key: c.key, Hash: c.hash}, true)); o.Err != nil {
		return o.Err
	}
	c.hold.Settle(claims.Committed)
	return nil
}

// Release ends the claim without recording the key; only the first end of
// a claim returns true. Waiters then look the key up again: the SQL ledger
// reads its table, not how a claim ended.
func (c *Claim) Release() bool { return c.hold.Settle(claims.Released) }

// Committed reports whether Commit recorded the key.
func (c *Claim) Committed() bool { return c.hold.State() == claims.Committed }

// ApplyAll submits every entry's transaction work at once, so that the
// workers can put them into shared transactions, then waits for each
// outcome; outcome i is entry i's. An entry moves on only after its commit.
func (sh *Pool) ApplyAll(ctx context.Context, entries []Entry) []Outcome {
	out := make([]Outcome, len(entries))
	reqs := make([]*Request, len(entries))
	for i, e := range entries {
		req := NewRequest(e, false)
		if err := sh.Submit(ctx, req); err != nil {
			out[i].Err = fmt.Errorf("dedup key %s: %w", e.Key, err)
			continue
		}
		reqs[i] = req
	}
	for i, req := range reqs {
		if req != nil {
			out[i] = sh.Wait(ctx, req)
		}
	}
	return out
}

// Verdict tells what an applied entry with payload hash was: Pass when it
// created the row (its statements committed), otherwise Duplicate, or
// Conflict when the stored hash differs.
func (o Outcome) Verdict(hash []byte) claims.Verdict {
	switch {
	case o.Inserted:
		return claims.Pass
	case len(o.ExistingHash) > 0 && !bytes.Equal(o.ExistingHash, hash):
		return claims.Conflict
	}
	return claims.Duplicate
}

// Store returns the table the pool writes (for inspection; writes go
// through requests).
func (sh *Pool) Store() *Store { return sh.store }
