// Package claims is what both dedup ledgers (the bbolt one in
// internal/ledger, the SQL one in internal/sqlledger) share: the Key they
// store, the Verdict a lookup gives, and the in-process claim table — while
// a message copy holds its key, another local copy of that key waits for it
// to settle instead of passing too.
//
// Invariant, enforced in Take: at most one Hold per key id exists at a
// time, and none is taken after closing is closed.
package claims

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/shutdown"
)

// Key names one effect in either ledger: the producer's namespace and its
// event ID. The pair is the identity; each store encodes it so that
// ("a","bc") and ("ab","c") never collide.
type Key struct {
	Namespace string
	ID        string
}

// String is the key as errors and logs show it: "namespace/ID", or "ID"
// without a namespace, quoted so that an empty or odd key is visible.
func (k Key) String() string {
	if k.Namespace == "" {
		return strconv.Quote(k.ID)
	}
	return strconv.Quote(k.Namespace + "/" + k.ID)
}

// Verdict is what a ledger found for a key.
type Verdict int

const (
	// Pass: the key is not applied; the caller holds a claim on it and must
	// commit or release it.
	Pass Verdict = iota
	// Duplicate: the key is applied with the same payload hash.
	Duplicate
	// Conflict: the key is applied with a different payload hash — the
	// producer reused an event ID for different content.
	Conflict
)

func (v Verdict) String() string {
	switch v {
	case Pass:
		return "pass"
	case Duplicate:
		return "duplicate"
	case Conflict:
		return "conflict"
	}
	return fmt.Sprintf("verdict(%d)", int(v))
}

// ErrInFlight means another copy of the key held its claim for longer than
// the caller was willing to wait.
var ErrInFlight = errors.New("another copy of this key is still in flight")

// ErrClosed is returned by Take once the table's owner is closing.
var ErrClosed = errors.New("claims: the ledger is closing")

// Table holds the claims of one ledger. The zero value is not usable; use
// New.
type Table struct {
	mu      sync.Mutex
	held    map[string]*Hold
	closing <-chan struct{}
}

// New returns an empty table; Take fails with ErrClosed once closing is
// closed (nil: never).
func New(closing <-chan struct{}) *Table {
	return &Table{held: map[string]*Hold{}, closing: closing}
}

// State of a Hold.
type State int32

const (
	Held      State = iota
	Committed       // the key was durably applied under this claim
	Released        // given up; the next copy may claim the key
)

// Hold is one copy's claim on a key id. It ends once, by Settle.
type Hold struct {
	t     *Table
	id    string
	state atomic.Int32
	once  sync.Once
	done  chan struct{}
}

// Take claims id. If another copy holds it, Take waits up to wait for that
// claim to settle and tries again; it fails with ErrInFlight after wait,
// with ctx's error when ctx ends, and with ErrClosed when the table closes.
func (t *Table) Take(ctx context.Context, id string, wait time.Duration) (*Hold, error) {
	var timeout <-chan time.Time // started only if a copy is in flight
	for {
		t.mu.Lock()
		if t.isClosed() {
			t.mu.Unlock()
			return nil, ErrClosed
		}
		other := t.held[id]
		if other == nil {
			h := &Hold{t: t, id: id, done: make(chan struct{})}
			t.held[id] = h
			t.mu.Unlock()
			return h, nil
		}
		t.mu.Unlock()
		if timeout == nil {
			tm := time.NewTimer(wait)
			defer tm.Stop()
			timeout = tm.C
		}
		select {
		case <-other.done: // settled: look again
		case <-timeout:
			return nil, ErrInFlight
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.closing:
			return nil, ErrClosed
		}
	}
}

func (t *Table) isClosed() bool { return shutdown.Closed(t.closing) }

// Held reports whether a copy holds id.
func (t *Table) Held(id string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.held[id] != nil
}

// Len returns the number of claims held.
func (t *Table) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.held)
}

// Holds returns the claims held now (for closing: settle what is left).
func (t *Table) Holds() []*Hold {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]*Hold, 0, len(t.held))
	for _, h := range t.held {
		out = append(out, h)
	}
	return out
}

// Done is closed when the claim settles.
func (h *Hold) Done() <-chan struct{} { return h.done }

// State returns Held until the claim settles, then how it settled.
func (h *Hold) State() State { return State(h.state.Load()) }

// Settle ends the claim as to (Committed or Released); waiters then look
// the key up again. Only the first call does anything, and only it returns
// true.
func (h *Hold) Settle(to State) bool {
	settled := false
	h.once.Do(func() {
		h.state.Store(int32(to))
		h.t.mu.Lock()
		if h.t.held[h.id] == h {
			delete(h.t.held, h.id)
		}
		h.t.mu.Unlock()
		close(h.done)
		settled = true
	})
	return settled
}
