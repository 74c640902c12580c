package sqlledger

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Check refuses a configuration the pool could not honour, before anything
// is opened, naming the dedup_ledger field at fault (sql.*). apply are the
// queries of sql.apply; each runs inside the ledger's transaction, so none
// may control it.
func (pc PoolConfig) Check(apply []string) error {
	c := pc.Config
	if _, err := lookupDialect(c.Driver); err != nil {
		return err
	}
	switch {
	case strings.TrimSpace(c.DSN) == "":
		return errors.New("sql.dsn is empty: give the SQLite file path or the PostgreSQL connection URL")
	case pc.MaxBatch < 1:
		return fmt.Errorf("sql.max_batch must be at least 1, got %d", pc.MaxBatch)
	case c.MaxOpenConns < 0 || c.MaxIdleConns < 0:
		return errors.New("sql.max_open_conns and sql.max_idle_conns must not be negative")
	case c.MaxRetries < 0:
		return fmt.Errorf("sql.retry.max_retries must not be negative, got %d", c.MaxRetries)
	}
	for _, d := range []struct {
		field string
		v     time.Duration
	}{
		{"conn_max_lifetime", c.ConnMaxLifetime}, {"connect_timeout", c.ConnectTimeout},
		{"transaction_timeout", c.TxTimeout}, {"startup_wait", pc.StartupWait}, {"busy_timeout", c.BusyTimeout},
	} {
		if d.v < 0 {
			return fmt.Errorf("sql.%s must not be negative", d.field)
		}
	}
	if err := c.backoff().Check("sql.retry"); err != nil {
		return fmt.Errorf("%w (got %s and %s)", err, c.RetryInitial, c.RetryMax)
	}
	for i, q := range pc.Init {
		if word, bad := TxControlIn(q); bad {
			return fmt.Errorf("sql.init_statements[%d] is a transaction-control statement (%s): each init statement runs on its own; remove it", i, word)
		}
	}
	for i, q := range apply {
		if strings.TrimSpace(q) == "" {
			return fmt.Errorf("sql.apply[%d].query is empty", i)
		}
		if word, bad := TxControlIn(q); bad {
			return fmt.Errorf("sql.apply[%d].query contains a transaction-control statement (%s): dedup_ledger runs the apply statements inside its own transaction with the ledger insert, so they must not begin, commit, roll back or use savepoints; remove it", i, word)
		}
	}
	return nil
}
