// Package groupcommit is the single-writer loop behind the outbox's and the
// ledger's durable writes: many callers, one transaction (one fsync) for
// everything waiting at that moment.
package groupcommit

import "runtime"

// Run takes requests from reqs and passes every request that is waiting, up
// to max at a time, to commit as one group. It never waits for more
// requests to arrive: a lone writer is committed at once. It returns when
// closing is closed; requests still in reqs are left to the caller.
//
// commit owns the group until it returns, and must settle every request in
// it (report its result to its caller).
func Run[T any](reqs <-chan T, closing <-chan struct{}, max int, commit func(group []T)) {
	group := make([]T, 0, min(max, 1024))
	var zero T
	for {
		select {
		case r := <-reqs:
			group = append(group[:0], r)
		case <-closing:
			return
		}
		group = drain(reqs, group, max)
		commit(group)
		for i := range group {
			group[i] = zero // let settled requests be collected
		}
	}
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
