package mqttclient

import "context"

// WatchLink calls set(true) when t has a ready connection and set(false)
// when it has none, starting with false, until ctx ends. Components export
// it as their `connected` gauge: it follows the link with or without
// traffic, since a lost connection (keepalive, a closed socket) ends Lost.
func WatchLink(ctx context.Context, t Transport, set func(up bool)) {
	for {
		set(false)
		conn, err := t.WaitReady(ctx)
		if err != nil {
			return
		}
		set(true)
		select {
		case <-conn.Lost():
		case <-ctx.Done():
			return
		}
	}
}

// LostContext returns a context that ends when lost is closed, with no
// goroutine: the Context of a Conn that keeps its own lost channel (the
// engines' test connections).
func LostContext(lost <-chan struct{}) context.Context {
	return lostContext{context.Background(), lost}
}

type lostContext struct {
	context.Context
	lost <-chan struct{}
}

func (c lostContext) Done() <-chan struct{} { return c.lost }

func (c lostContext) Err() error {
	select {
	case <-c.lost:
		return context.Canceled
	default:
		return nil
	}
}
