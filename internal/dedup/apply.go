package dedup

import (
	"context"
	"fmt"

	"github.com/reliable-mqtt/reliable-mqtt/internal/claims"
	"github.com/reliable-mqtt/reliable-mqtt/internal/failpoint"
	"github.com/reliable-mqtt/reliable-mqtt/internal/sqlledger"
)

// Apply commits entries with their sql.apply statements, sharing
// transactions, and decides each copy: Pass once its row and statements
// committed (counted in Passed and Commits), Duplicate or Conflict when
// the key was applied before (its statements did not run), Err when its
// transaction failed and nothing of it was committed.
func (g *Gate) Apply(ctx context.Context, p *sqlledger.Pool, entries []sqlledger.Entry) []Decision {
	ds := make([]Decision, len(entries))
	for j, o := range p.ApplyAll(ctx, entries) {
		e := entries[j]
		ds[j] = Decision{Verdict: o.Verdict(e.Hash), Err: o.Err}
		if o.Err != nil {
			ds[j].Err = fmt.Errorf("dedup_ledger: the apply transaction of key %s failed, nothing was committed and the message is not acknowledged (it will be retried): %w", e.Key, o.Err)
		} else if ds[j].Verdict == claims.Pass {
			// Committed, not yet acknowledged: the crash window of seed 001.
			failpoint.Hit(failpoint.SQLCommitted)
			g.Commits.Incr(1)
			g.Passed.Incr(1)
		}
	}
	return ds
}
