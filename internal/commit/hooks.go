package commit

import (
	"context"
	"errors"
	"sync"
)

// DeliveryHook runs when the pipeline has finished with a message: result is
// nil when the message was acknowledged (its output succeeded, or it was
// deliberately filtered) and the error otherwise. A hook that fails on a
// successful result turns it into a failure: the input does not acknowledge
// the message to the broker, which redelivers it.
type DeliveryHook func(ctx context.Context, result error) error

// Hooks is the list an input attaches to each message it reads. Processors
// register on it; the input runs it once, with the final result, before it
// acknowledges the message to its source.
type Hooks struct {
	mu    sync.Mutex
	hooks []DeliveryHook
	ran   bool
}

type hooksKey struct{}

// WithHooks returns a context carrying a new, empty hook list.
func WithHooks(ctx context.Context) (context.Context, *Hooks) {
	h := &Hooks{}
	return context.WithValue(ctx, hooksKey{}, h), h
}

// HooksFrom returns the hook list of the input that read the message, or
// nil when the message did not come from such an input.
func HooksFrom(ctx context.Context) *Hooks {
	h, _ := ctx.Value(hooksKey{}).(*Hooks)
	return h
}

// ErrHooksRan is returned by Register after the list has run.
var ErrHooksRan = errors.New("commit: the message's delivery hooks already ran")

// Register adds a hook. It fails once the list has run, which happens only
// if a processor holds a message past its acknowledgement.
func (h *Hooks) Register(hook DeliveryHook) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ran {
		return ErrHooksRan
	}
	h.hooks = append(h.hooks, hook)
	return nil
}

// Run runs every hook once, in registration order, and returns the joined
// errors of those that failed. Every hook runs even if an earlier one
// failed, so that each can release what it holds. A second Run does nothing.
func (h *Hooks) Run(ctx context.Context, result error) error {
	h.mu.Lock()
	if h.ran {
		h.mu.Unlock()
		return nil
	}
	h.ran = true
	hooks := h.hooks
	h.mu.Unlock()
	var errs []error
	for _, hook := range hooks {
		if err := hook(ctx, result); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
