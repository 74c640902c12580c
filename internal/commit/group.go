package commit

import (
	"context"
	"errors"
	"sync"
)

// Group gathers work that the delivery hooks of several messages defer so
// that one commit does it for all of them: the keys a dedup ledger records
// for the events of one frame, in one transaction. The input that runs the
// hooks of such messages passes a Group in the hooks' context (WithGroup)
// and flushes it once every hook ran; a hook without a Group in its
// context does its work itself.
type Group struct {
	mu    sync.Mutex
	order []any
	work  map[any]*deferred
	done  bool
}

type deferred struct {
	items []any
	flush func(ctx context.Context, items []any) error
}

type groupKey struct{}

// WithGroup returns a context carrying a new, empty Group.
func WithGroup(ctx context.Context) (context.Context, *Group) {
	g := &Group{work: map[any]*deferred{}}
	return context.WithValue(ctx, groupKey{}, g), g
}

// GroupFrom returns the Group in ctx, or nil.
func GroupFrom(ctx context.Context) *Group {
	g, _ := ctx.Value(groupKey{}).(*Group)
	return g
}

// ErrGroupFlushed is returned by Defer after Flush.
var ErrGroupFlushed = errors.New("commit: the group was already flushed")

// Defer adds item to the work of key; the first Defer of key names the
// flush that Flush calls once with all of key's items. The caller keeps
// what item holds until flush settles it.
func (g *Group) Defer(key, item any, flush func(ctx context.Context, items []any) error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.done {
		return ErrGroupFlushed
	}
	d, ok := g.work[key]
	if !ok {
		d = &deferred{flush: flush}
		g.work[key] = d
		g.order = append(g.order, key)
	}
	d.items = append(d.items, item)
	return nil
}

// Flush runs each key's flush once, in the order the keys were first
// deferred, and returns their joined errors. Later calls do nothing.
func (g *Group) Flush(ctx context.Context) error {
	g.mu.Lock()
	if g.done {
		g.mu.Unlock()
		return nil
	}
	g.done = true
	g.mu.Unlock()
	var errs []error
	for _, k := range g.order {
		d := g.work[k]
		errs = append(errs, d.flush(ctx, d.items))
	}
	return errors.Join(errs...)
}
