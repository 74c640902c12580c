package sqlledger

import (
	"strings"
	"testing"
	"time"
)

// Words inside strings and identifiers are not transaction control.
func TestTxControlInIgnoresStringsAndIdentifiers(t *testing.T) {
	for _, q := range []string{
		"UPDATE notes SET body = 'commit; begin' WHERE id = ?",
		"INSERT INTO ends (x) VALUES (?)",
		"UPDATE c SET v = v + 1;",
	} {
		if w, bad := TxControlIn(q); bad {
			t.Errorf("%q refused as transaction control (%s)", q, w)
		}
	}
}

// A configuration the pool could not honour is refused with the field at
// fault, before anything is opened.
func TestCheckNamesTheFieldAtFault(t *testing.T) {
	good := func() PoolConfig {
		return PoolConfig{Config: Config{Driver: SQLite, DSN: "x.db", RetryInitial: time.Millisecond, RetryMax: time.Second}, MaxBatch: 1}
	}
	if err := good().Check([]string{"UPDATE c SET v = v + 1"}); err != nil {
		t.Fatalf("a good configuration was refused: %v", err)
	}
	for _, tc := range []struct {
		change func(*PoolConfig)
		apply  []string
		want   string
	}{
		{func(pc *PoolConfig) { pc.Driver = "mysql" }, nil, "sql.driver"},
		{func(pc *PoolConfig) { pc.DSN = " " }, nil, "sql.dsn"},
		{func(pc *PoolConfig) { pc.MaxBatch = 0 }, nil, "sql.max_batch"},
		{func(pc *PoolConfig) { pc.MaxIdleConns = -1 }, nil, "sql.max_open_conns"},
		{func(pc *PoolConfig) { pc.BusyTimeout = -1 }, nil, "sql.busy_timeout"},
		{func(pc *PoolConfig) { pc.RetryMax = 0 }, nil, "sql.retry"},
		{func(pc *PoolConfig) { pc.MaxRetries = -1 }, nil, "sql.retry.max_retries"},
		{func(pc *PoolConfig) { pc.Init = []string{"COMMIT"} }, nil, "sql.init_statements[0]"},
		{func(*PoolConfig) {}, []string{"UPDATE c SET v = 1", ""}, "sql.apply[1].query is empty"},
		{func(*PoolConfig) {}, []string{"UPDATE c SET v = 1; COMMIT"}, "sql.apply[0].query contains a transaction-control statement (COMMIT)"},
	} {
		pc := good()
		tc.change(&pc)
		if err := pc.Check(tc.apply); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v with apply %q: got %v, want an error naming %s", pc, tc.apply, err, tc.want)
		}
	}
}
