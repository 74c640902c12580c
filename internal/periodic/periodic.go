// Package periodic is the one loop of background chores (expiring ledger
// keys, pushing metrics, refreshing outbox gauges): a function run once
// per interval until its owner stops it.
package periodic

import "time"

// Run calls fn every interval until stop is closed, and returns then. A
// call in progress finishes first: fn bounds its own work.
func Run(stop <-chan struct{}, every time.Duration, fn func()) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			fn()
		}
	}
}
