// Package groupcommit is the single-writer loop behind every durable write
// of the tree: the outbox's and the bbolt ledger's committers, the SQL
// ledger's workers and the embedded broker's store writer. Many callers,
// one transaction (one fsync) for everything waiting at that moment.
package groupcommit

import (
	"runtime"
	"time"
)

// Run takes requests from reqs and passes every request that is waiting, up
// to max at a time, to commit as one group. It never waits for more
// requests to arrive: a lone writer is committed at once. It returns when
// closing is closed; requests still in reqs are left to the caller.
//
// commit owns the group until it returns, and must settle every request in
// it (report its result to its caller).
func Run[T any](reqs <-chan T, closing <-chan struct{}, max int, commit func(group []T)) {
	Loop[T]{Max: max}.Run(reqs, closing, commit)
}

// Loop is Run with its settings. Several goroutines may run one Loop over
// one channel (the SQL ledger runs one per connection); each group is then
// one goroutine's.
type Loop[T any] struct {
	// Max is how many requests one group holds at most.
	Max int
	// Linger, if positive, holds a group in which no request Waits up to
	// this long for one that does, so that the waiter shares its commit
	// instead of paying for a second one. The group is committed as soon as
	// a waiting request joins it, when Linger has passed, or at closing.
	Linger time.Duration
	// Waits reports whether a caller blocks on r's result; needed with
	// Linger and Delay.
	Waits func(r T) bool
	// Delay, if positive, holds a group in which a request Waits up to this
	// long for more requests, so that fewer commits (fewer bytes written to
	// the disk) carry the same requests; each waiter's latency grows by up
	// to Delay. The group is committed when Delay has passed, when it is
	// full, or at closing.
	Delay time.Duration
}

// Run is the loop; see the package function Run.
func (l Loop[T]) Run(reqs <-chan T, closing <-chan struct{}, commit func(group []T)) {
	group := make([]T, 0, min(l.Max, 1024))
	var zero T
	for {
		select {
		case r := <-reqs:
			group = append(group[:0], r)
		case <-closing:
			return
		}
		group = drain(reqs, group, l.Max)
		if l.Linger > 0 && !l.anyWaits(group) {
			group = l.gather(reqs, closing, group, l.Linger, true)
		}
		if l.Delay > 0 && l.anyWaits(group) {
			group = l.gather(reqs, closing, group, l.Delay, false)
		}
		commit(group)
		for i := range group {
			group[i] = zero // let settled requests be collected
		}
	}
}

func (l Loop[T]) anyWaits(group []T) bool {
	for _, r := range group {
		if l.Waits(r) {
			return true
		}
	}
	return false
}

// gather adds requests to group until wait passes, closing is closed or
// the group is full. Lingering (a group nobody waits for) also ends when a
// request somebody waits for arrives; delaying (a group somebody waits
// for) waits the whole Delay.
func (l Loop[T]) gather(reqs <-chan T, closing <-chan struct{}, group []T, wait time.Duration, lingering bool) []T {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for len(group) < l.Max {
		select {
		case r := <-reqs:
			group = append(group, r)
			if lingering && l.Waits(r) {
				return drain(reqs, group, l.Max)
			}
		case <-timer.C:
			return group
		case <-closing:
			return group
		}
	}
	return group
}

// drain adds every request that is ready. Writers woken by the previous
// commit may not have run yet; yielding once lets them queue up, so the next
// transaction carries them all instead of a few while the rest wait a whole
// fsync. With one writer this costs a scheduler pass, not a timed delay.
func drain[T any](reqs <-chan T, group []T, max int) []T {
	for yielded := false; len(group) < max; {
		select {
		case r := <-reqs:
			group = append(group, r)
			yielded = false
		default:
			if yielded {
				return group
			}
			runtime.Gosched()
			yielded = true
		}
	}
	return group
}
