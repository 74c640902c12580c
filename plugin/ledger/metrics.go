package ledger

import "github.com/redpanda-data/benthos/v4/public/service"

type metrics struct {
	passed     tally                  // first copies let through (claimed)
	duplicates tally                  // copies of an applied key
	conflicts  *service.MetricCounter // same key, different payload
	commits    *service.MetricCounter // keys recorded as applied
	releases   *service.MetricCounter // claims given up (the message failed)
	errors     *service.MetricCounter // messages that could not be checked
	keys       *service.MetricGauge   // applied keys in the file
}

func newMetrics(mgr *service.Resources, s settings) *metrics {
	m := mgr.Metrics()
	sum := &summary{log: mgr.Logger(), flag: s.flag, every: summaryInterval}
	return &metrics{
		passed:     tally{m.NewCounter("dedup_ledger_passed"), func(n int64) { sum.add(n, 0) }},
		duplicates: tally{m.NewCounter("dedup_ledger_duplicates"), func(n int64) { sum.add(0, n) }},
		conflicts:  m.NewCounter("dedup_ledger_conflicts"),
		commits:    m.NewCounter("dedup_ledger_commits"),
		releases:   m.NewCounter("dedup_ledger_releases"),
		errors:     m.NewCounter("dedup_ledger_errors"),
		keys:       m.NewGauge("dedup_ledger_keys"),
	}
}
