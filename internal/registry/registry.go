// Package registry shares one handle per identity within a process (a
// ledger file, an SQL ledger table), counting its users.
//
// Invariant, enforced under the registry's lock: an identity has an entry
// exactly while its handle has at least one user; the last Release removes
// it, and the caller then closes the handle.
package registry

import "sync"

// Registry maps identities to shared handles. The zero value is ready.
type Registry[T comparable] struct {
	mu sync.Mutex
	m  map[string]*entry[T]
}

type entry[T comparable] struct {
	v    T
	refs int
}

// Acquire returns the handle of id. If one is open, join decides whether
// this caller may share it (its error refuses); otherwise open makes one.
// Both run under the registry's lock, so two callers cannot both open id.
// Every successful Acquire needs a Release.
func (r *Registry[T]) Acquire(id string, join func(T) error, open func() (T, error)) (T, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e := r.m[id]; e != nil {
		if err := join(e.v); err != nil {
			var zero T
			return zero, err
		}
		e.refs++
		return e.v, nil
	}
	v, err := open()
	if err != nil {
		return v, err
	}
	if r.m == nil {
		r.m = map[string]*entry[T]{}
	}
	r.m[id] = &entry[T]{v: v, refs: 1}
	return v, nil
}

// Release gives up one use of v, registered as id. It reports whether that
// was the last (the entry is gone and the caller must close v). A v that is
// not the registered handle of id (already released for good) is ignored.
func (r *Registry[T]) Release(id string, v T) (last bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.drop(id, v)
}

// ReleaseClose is Release for a handle that must be closed before id can be
// opened again (a file lock): when this was the last use, close runs under
// the registry's lock, so a concurrent Acquire of id waits for it. The
// entry is removed even if close fails.
func (r *Registry[T]) ReleaseClose(id string, v T, close func(T) error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.drop(id, v) {
		return nil
	}
	return close(v)
}

// drop counts one use of v off; r.mu must be held.
func (r *Registry[T]) drop(id string, v T) (last bool) {
	e := r.m[id]
	if e == nil || e.v != v {
		return false
	}
	e.refs--
	if e.refs > 0 {
		return false
	}
	delete(r.m, id)
	return true
}

// Clear removes every entry, handing each handle to close. For tests that
// reset a process-wide registry.
func (r *Registry[T]) Clear(close func(T)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, e := range r.m {
		close(e.v)
		delete(r.m, id)
	}
}
