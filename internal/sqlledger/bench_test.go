package sqlledger

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/claims"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// BenchmarkApply: 64 goroutines each Apply a distinct key with the seed's
// counter statement; msgs/s is committed, durable (for SQLite, fsynced)
// Applies per second. PostgreSQL runs with fsync off (test cluster), so
// its figure measures round trips and locking, not disk.
func BenchmarkApply(b *testing.B) {
	for _, name := range []string{"sqlite", "postgres"} {
		b.Run(name, func(b *testing.B) {
			be, s := benchStore(b, name)
			ctx := context.Background()
			st := []Exec{incr(be, 1)}
			var next atomic.Int64
			// RunParallel starts parallelism × GOMAXPROCS goroutines.
			b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					k := claims.Key{Namespace: "bench", ID: fmt.Sprint(next.Add(1))}
					if _, err := s.Apply(ctx, k, nil, st); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
		})
	}
}

// BenchmarkApplyBatch: one goroutine applies batches of 64 distinct keys,
// one transaction (one commit) per batch; msgs/s counts messages.
func BenchmarkApplyBatch(b *testing.B) {
	const size = 64
	for _, name := range []string{"sqlite", "postgres"} {
		b.Run(name, func(b *testing.B) {
			be, s := benchStore(b, name)
			ctx := context.Background()
			st := []Exec{incr(be, 1)}
			n := 0
			b.ResetTimer()
			start := time.Now()
			for b.Loop() {
				entries := make([]Entry, size)
				for i := range entries {
					n++
					entries[i] = Entry{Key: claims.Key{Namespace: "bench", ID: fmt.Sprint(n)}, Stmts: st}
				}
				if _, err := s.ApplyBatch(ctx, entries); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n)/time.Since(start).Seconds(), "msgs/s")
		})
	}
}

// benchStore opens a fresh ledger with the counter table on the named
// backend.
func benchStore(b *testing.B, name string) (backend, *Store) {
	be := sqliteBackend()
	if name == "postgres" {
		be = postgresBackend(harness.StartPostgres(b))
	}
	return be, newStore(b, be, nil)
}
