package ledger

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/reliable-mqtt/reliable-mqtt/internal/benchtest"
	"github.com/reliable-mqtt/reliable-mqtt/internal/boltfile"
	"github.com/reliable-mqtt/reliable-mqtt/internal/claims"
)

// BenchmarkClaimCommit64 measures check + durable commit: 64 concurrent
// messages each claim a new key and commit it through the group committer
// (the delivery-hook path), fsync included.
func BenchmarkClaimCommit64(b *testing.B) {
	l := openT(b, filepath.Join(b.TempDir(), "ledger.db"), Options{})
	h := hashOf("payload")
	benchtest.Concurrent(b, 64, func(i int64) error {
		c, v, err := l.Claim(context.Background(), claims.Key{Namespace: "bench", ID: strconv.FormatInt(i, 10)}, h, time.Second)
		if err != nil || v != claims.Pass {
			return fmt.Errorf("claim: %v %v", v, err)
		}
		return c.Commit(context.Background())
	})
}

// fill writes n keys in large transactions (one fsync per 100k keys).
func fill(b *testing.B, l *Ledger, n int) {
	b.Helper()
	h := hashOf("payload")
	now := time.Now()
	for from := 0; from < n; from += 100_000 {
		err := l.db.Update(func(tx *bolt.Tx) error {
			tx.Bucket(bucketKeys).FillPercent = 0.9
			for i := from; i < min(from+100_000, n); i++ {
				k, _ := encodeKey(claims.Key{Namespace: "bench", ID: fmt.Sprintf("key-%09d", i)})
				if _, _, err := put(tx, k, h, now); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	l.keys.Store(int64(n))
}

// BenchmarkLookup measures one Claim against a ledger of 10k or 1M keys:
// "hit" finds an applied key (a duplicate), "miss" claims a new key and
// releases it (a first copy, before its commit).
//
// LEDGER_BENCH_10M=1 adds a 10M-key ledger (~35 s
// to fill on 2 cores).
func BenchmarkLookup(b *testing.B) {
	sizes := []int{10_000, 1_000_000}
	if os.Getenv("LEDGER_BENCH_10M") != "" {
		sizes = append(sizes, 10_000_000)
	}
	for _, size := range sizes {
		l := openT(b, filepath.Join(b.TempDir(), "ledger.db"), Options{})
		fill(b, l, size)
		h := hashOf("payload")
		b.Run(fmt.Sprintf("keys=%d/hit", size), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				_, v, err := l.Claim(context.Background(), claims.Key{Namespace: "bench", ID: fmt.Sprintf("key-%09d", (i*7919)%size)}, h, time.Second)
				if err != nil || v != claims.Duplicate {
					b.Fatal(v, err)
				}
			}
		})
		b.Run(fmt.Sprintf("keys=%d/miss", size), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				c, v, err := l.Claim(context.Background(), claims.Key{Namespace: "bench", ID: fmt.Sprintf("new-%09d", i)}, h, time.Second)
				if err != nil || v != claims.Pass {
					b.Fatal(v, err)
				}
				c.Release()
			}
		})
	}
}

// BenchmarkOpenVerify measures opening a ledger of 1M keys (10M with
// LEDGER_BENCH_10M=1) with verify_on_start always (every page read,
// bbolt's Tx.Check, every entry's checksum, the key count) and never, from
// a warm page cache.
func BenchmarkOpenVerify(b *testing.B) {
	sizes := []int{1_000_000}
	if os.Getenv("LEDGER_BENCH_10M") != "" {
		sizes = append(sizes, 10_000_000)
	}
	for _, size := range sizes {
		path := filepath.Join(b.TempDir(), "ledger.db")
		l := openT(b, path, Options{})
		fill(b, l, size)
		if err := l.Close(); err != nil {
			b.Fatal(err)
		}
		benchtest.OpenVerify(b, fmt.Sprintf("keys=%d", size), path, func(v boltfile.Verify) error {
			l, err := Open(path, Options{Verify: v})
			if err != nil {
				return err
			}
			return l.Close()
		})
	}
}
