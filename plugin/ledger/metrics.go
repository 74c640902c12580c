package ledger

import "github.com/redpanda-data/benthos/v4/public/service"

type metrics struct {
	passed     *service.MetricCounter // first copies let through (claimed)
	duplicates *service.MetricCounter // copies of an applied key
	conflicts  *service.MetricCounter // same key, different payload
	commits    *service.MetricCounter // keys recorded as applied
	releases   *service.MetricCounter // claims given up (the message failed)
	errors     *service.MetricCounter // messages that could not be checked
	keys       *service.MetricGauge   // applied keys in the file
}

func newMetrics(m *service.Metrics) *metrics {
	return &metrics{
		passed:     m.NewCounter("dedup_ledger_passed"),
		duplicates: m.NewCounter("dedup_ledger_duplicates"),
		conflicts:  m.NewCounter("dedup_ledger_conflicts"),
		commits:    m.NewCounter("dedup_ledger_commits"),
		releases:   m.NewCounter("dedup_ledger_releases"),
		errors:     m.NewCounter("dedup_ledger_errors"),
		keys:       m.NewGauge("dedup_ledger_keys"),
	}
}
