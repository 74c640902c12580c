package sqlledger

import (
	"fmt"
	"sync"
	"testing"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// Consumers started at once on a fresh PostgreSQL database all run the same
// init statements; CREATE TABLE IF NOT EXISTS can then collide in the
// catalog (a unique violation) although the statement is idempotent. Every
// consumer must start: init statements are retried (ExecSetup) as Open
// retries its own table creation.
func TestInitStatementsSurviveConcurrentStarts(t *testing.T) {
	pg := harness.StartPostgres(t)
	const consumers, rounds = 8, 20
	for round := range rounds {
		dsn := pg.NewDatabase(t)
		stores := make([]*Store, consumers)
		for i := range stores {
			// Its own table, as another consumer's would be opened.
			stores[i] = open(t, postgresBackend(pg), dsn, func(c *Config) { c.Table = fmt.Sprintf("ledger_%d", i) })
		}
		errs := make([]error, consumers)
		var start, wg sync.WaitGroup
		start.Add(1)
		for i, s := range stores {
			wg.Add(1)
			go func() {
				defer wg.Done()
				start.Wait()
				errs[i] = s.ExecSetup(testCtx(t), `CREATE TABLE IF NOT EXISTS counter (id INTEGER PRIMARY KEY, value INTEGER NOT NULL)`)
			}()
		}
		start.Done()
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d, consumer %d of %d started at once: %v", round, i, consumers, err)
			}
		}
	}
}
