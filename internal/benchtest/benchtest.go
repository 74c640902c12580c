// Package benchtest holds the benchmark loops that the outbox, the ledger
// and the plugins share, so that the figures docs/performance.md compares
// are measured the same way. Only benchmarks import it.
package benchtest

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/boltfile"
)

// Concurrent runs op(i) for i = 1..b.N from workers goroutines, each
// taking the next i (64 workers: 64 messages in flight), and reports the
// rate as msgs/s. An op's error is reported with b.Error and ends its
// goroutine.
func Concurrent(b *testing.B, workers int, op func(i int64) error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				if err := op(i); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
}

// OpenVerify measures opening the closed file at path with verify_on_start
// always and never, from a warm page cache: one sub-benchmark each, named
// "<name>/MiB=<size>/verify=<mode>". open opens the file with that mode
// and closes it.
func OpenVerify(b *testing.B, name, path string, open func(boltfile.Verify) error) {
	st, err := os.Stat(path)
	if err != nil {
		b.Fatal(err)
	}
	for _, v := range []boltfile.Verify{boltfile.VerifyAlways, boltfile.VerifyNever} {
		b.Run(fmt.Sprintf("%s/MiB=%d/verify=%s", name, st.Size()>>20, v), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				if err := open(v); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
