package outbox

import (
	"context"
	"fmt"
)

// Admission: MaxPending and MaxPendingBytes bound what is stored plus what
// is admitted and not yet committed, so concurrent writers cannot overshoot
// them; a writer waits for space (backpressure), never drops.

// reserve admits an append of sz bytes, waiting while the outbox is full.
// Admitted appends count against the limits until the committer settles
// them, so concurrent writers cannot overshoot MaxPending.
func (o *Outbox) reserve(ctx context.Context, sz int64) error {
	for {
		o.mu.Lock()
		if o.fits(sz) {
			o.reservedN++
			o.reservedBytes += sz
			o.mu.Unlock()
			return nil
		}
		freed := o.freed
		pending, pendingBytes := o.stats.Pending, o.stats.PendingBytes
		o.mu.Unlock()
		select {
		case <-freed:
		case <-o.closing:
			return fmt.Errorf("outbox file %s: %w while waiting for space", o.path, ErrClosed)
		case <-ctx.Done():
			return fmt.Errorf("outbox file %s is full (%d records, %d bytes pending; max_pending %d, max_pending_bytes %d); nothing appended: %w",
				o.path, pending, pendingBytes, o.opts.MaxPending, o.opts.MaxPendingBytes, ctx.Err())
		}
	}
}

// tryReserve admits an append of sz bytes if it fits now.
func (o *Outbox) tryReserve(sz int64) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.fits(sz) {
		return false
	}
	o.reservedN++
	o.reservedBytes += sz
	return true
}

// fits reports whether sz more bytes may be admitted. Caller holds o.mu.
func (o *Outbox) fits(sz int64) bool {
	n := o.stats.Pending + o.reservedN
	if o.opts.MaxPending > 0 && n >= o.opts.MaxPending {
		return false
	}
	if o.opts.MaxPendingBytes > 0 && n > 0 && o.stats.PendingBytes+o.reservedBytes+sz > o.opts.MaxPendingBytes {
		return false
	}
	return true
}

// unreserve returns an admission that never reached the committer.
func (o *Outbox) unreserve(sz int64) {
	o.mu.Lock()
	o.reservedN--
	o.reservedBytes -= sz
	o.wakeWaitersLocked()
	o.mu.Unlock()
}

// wakeWaitersLocked wakes every Append waiting for space. Caller holds o.mu.
func (o *Outbox) wakeWaitersLocked() {
	close(o.freed)
	o.freed = make(chan struct{})
}
