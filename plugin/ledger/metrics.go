package ledger

import (
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/dedup"
)

type metrics struct {
	passed     dedup.Counter          // first copies let through (claimed)
	duplicates dedup.Counter          // copies of an applied key
	conflicts  *service.MetricCounter // same key, different payload
	commits    *service.MetricCounter // keys recorded as applied
	releases   *service.MetricCounter // claims given up (the message failed)
	errors     *service.MetricCounter // messages that could not be checked
	keys       *service.MetricGauge   // applied keys in the file
	written    *service.MetricCounter // bytes bbolt wrote to the file (flash wear)
	// SQL only: 1 while a read-write server answers, 0 while start-up or
	// transactions wait for one; transactions run again (label reason:
	// unavailable or conflict).
	sqlAvailable *service.MetricGauge
	sqlRetries   *service.MetricCounter
}

// newMetrics registers the metrics; passed and duplicates also feed the
// periodic summary line.
func newMetrics(mgr *service.Resources, s settings) *metrics {
	m := mgr.Metrics()
	sum := &dedup.Summary{Logf: mgr.Logger().Infof, Every: dedup.SummaryInterval}
	ms := &metrics{
		passed:     dedup.Counting(m.NewCounter("dedup_ledger_passed"), func(n int64) { sum.Add(n, 0) }),
		duplicates: dedup.Counting(m.NewCounter("dedup_ledger_duplicates"), func(n int64) { sum.Add(0, n) }),
		conflicts:  m.NewCounter("dedup_ledger_conflicts"),
		commits:    m.NewCounter("dedup_ledger_commits"),
		releases:   m.NewCounter("dedup_ledger_releases"),
		errors:     m.NewCounter("dedup_ledger_errors"),
		keys:       m.NewGauge("dedup_ledger_keys"),
	}
	if s.sql == nil {
		ms.written = m.NewCounter("dedup_ledger_written_bytes")
	}
	if s.sql != nil {
		ms.sqlAvailable = m.NewGauge("dedup_ledger_sql_available")
		ms.sqlRetries = m.NewCounter("dedup_ledger_sql_retries", "reason")
	}
	return ms
}
