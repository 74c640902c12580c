package outbox

import (
	"context"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/periodic"
)

// Logger is what ReportStart writes through (Benthos's *service.Logger
// fits).
type Logger interface {
	Errorf(format string, args ...any)
	Warnf(format string, args ...any)
	Infof(format string, args ...any)
}

// ReportStart logs what an operator must know of an outbox just opened: a
// damaged meta page, a compaction that did not happen, and the backlog it
// still holds, so that after a crash or a restart it is visible that the
// backlog is picked up again.
func (o *Outbox) ReportStart(log Logger) {
	if md := o.MetaDamage(); md != nil && md.RolledBack() {
		log.Errorf("%v. The outbox is used as it is: records confirmed in the lost commit are published again, and records appended in it are missing", md)
	} else if md != nil {
		log.Warnf("%v", md)
	}
	if err := o.CompactionSkipped(); err != nil {
		log.Warnf("Outbox %s: not compacted at start, the file keeps its size: %v", o.path, err)
	}
	st := o.Stats()
	if st.Pending == 0 {
		log.Infof("outbox %s: no pending records", o.path)
		return
	}
	log.Infof("outbox %s: resuming %d pending records (%d bytes), oldest from %s",
		o.path, st.Pending, st.PendingBytes, st.Oldest.UTC().Format(time.RFC3339))
}

// Watch calls fn, on a goroutine of its own, with the outbox's stats at
// once and then once a second (more often if every is shorter) until ctx
// ends; the returned channel is closed then. report is true when every > 0
// has passed since the last report: time for a summary line.
func (o *Outbox) Watch(ctx context.Context, every time.Duration, fn func(st Stats, report bool)) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		o.watch(ctx, every, fn)
	}()
	return done
}

func (o *Outbox) watch(ctx context.Context, every time.Duration, fn func(st Stats, report bool)) {
	tick := time.Second
	if every > 0 && every < tick {
		tick = every
	}
	lastReport := time.Now()
	call := func() {
		report := every > 0 && time.Since(lastReport) >= every
		if report {
			lastReport = time.Now()
		}
		fn(o.Stats(), report)
	}
	call()
	periodic.Run(ctx.Done(), tick, call)
}
