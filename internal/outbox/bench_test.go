package outbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/reliable-mqtt/reliable-mqtt/internal/benchtest"
	"github.com/reliable-mqtt/reliable-mqtt/internal/boltfile"
	"github.com/reliable-mqtt/reliable-mqtt/internal/mqttmsg"
)

var benchPayload = make([]byte, 100)

// BenchmarkAppend64Writers measures durable (fsync'd) appends with 64
// concurrent writers and group commit.
func BenchmarkAppend64Writers(b *testing.B) {
	o := openT(b, filepath.Join(b.TempDir(), "out.db"), Options{})
	benchtest.Concurrent(b, 64, func(i int64) error {
		_, err := o.Append(context.Background(), Entry{Event: mqttmsg.Event{EventID: fmt.Sprintf("e%d", i), Topic: "bench/topic", Payload: benchPayload}})
		return err
	})
}

// BenchmarkAppendBatch64x64 measures AppendBatch from 64 goroutines, 64
// entries each: what reliable_mqtt_out does with batches of 64 and 64
// writes in flight. Up to 4,096 records wait, so transactions fill to
// MaxBatch (1,024).
func BenchmarkAppendBatch64x64(b *testing.B) {
	o := openT(b, filepath.Join(b.TempDir(), "out.db"), Options{})
	const writers, perBatch = 64, 64
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			entries := make([]Entry, 0, perBatch)
			for {
				first := next.Add(perBatch) - perBatch
				if first >= int64(b.N) {
					return
				}
				entries = entries[:0]
				for i := first; i < min(first+perBatch, int64(b.N)); i++ {
					entries = append(entries, Entry{Event: mqttmsg.Event{EventID: fmt.Sprintf("e%d", i), Topic: "bench/topic", Payload: benchPayload}})
				}
				_, errs := o.AppendBatch(context.Background(), entries)
				for _, err := range errs {
					if err != nil {
						b.Error(err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
}

// BenchmarkBareBoltGroupCommit is the ceiling for Append64Writers: one
// committer writing perTx 100-byte records per fsync'd bbolt transaction
// (seq key -> payload, the same bucket fill as the outbox's records), and
// nothing else: no channels, no index, no encoding, no counters. perTx=64
// is what 64 writers can put in one group at most.
func BenchmarkBareBoltGroupCommit(b *testing.B) {
	for _, perTx := range []int{64, 1024} {
		b.Run(fmt.Sprintf("perTx=%d", perTx), func(b *testing.B) {
			db, err := bolt.Open(filepath.Join(b.TempDir(), "bare.db"), 0o600, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			name := []byte("records")
			b.ResetTimer()
			start := time.Now()
			for done := 0; done < b.N; {
				n := min(perTx, b.N-done)
				err := db.Update(func(tx *bolt.Tx) error {
					bk, err := tx.CreateBucketIfNotExists(name)
					if err != nil {
						return err
					}
					bk.FillPercent = 1.0
					for i := 0; i < n; i++ {
						seq, _ := bk.NextSequence()
						if err := bk.Put(seqKey(seq), benchPayload); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
				done += n
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
		})
	}
}

// BenchmarkAppendSerial measures one writer: one fsync per append.
func BenchmarkAppendSerial(b *testing.B) {
	o := openT(b, filepath.Join(b.TempDir(), "out.db"), Options{})
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		if _, err := o.Append(context.Background(), Entry{Event: mqttmsg.Event{EventID: fmt.Sprintf("e%d", i), Topic: "bench/topic", Payload: benchPayload}}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
}

// fillBacklog writes n records in large transactions through the
// committer's own append path (one fsync per 50k records) and returns the
// first and last seq.
func fillBacklog(b testing.TB, o *Outbox, n int) (first, last uint64) {
	b.Helper()
	const perTx = 50_000
	for done := 0; done < n; {
		batch := make([]*request, 0, perTx)
		for i := 0; i < perTx && done+i < n; i++ {
			id := fmt.Sprintf("backlog-%d", done+i)
			batch = append(batch, &request{ctx: context.Background(), entry: &Entry{Event: mqttmsg.Event{EventID: id, Topic: "bench/topic", Payload: benchPayload}},
				size: size(id, "bench/topic", nil, benchPayload), done: make(chan struct{}, 1)})
		}
		o.mu.Lock()
		o.reservedN += len(batch)
		for _, r := range batch {
			o.reservedBytes += r.size
		}
		o.mu.Unlock()
		o.commit(batch, false)
		for _, r := range batch {
			if r.err != nil {
				b.Fatal(r.err)
			}
			if first == 0 {
				first = r.rec.Seq
			}
			last = r.rec.Seq
		}
		done += len(batch)
	}
	return first, last
}

// BenchmarkRemove removes single records (one fsync'd transaction each)
// from the front of a backlog, to show Remove does not slow with backlog size.
func BenchmarkRemove(b *testing.B) {
	for _, pending := range []int{1000, 1_000_000} {
		b.Run(fmt.Sprintf("pending=%d", pending), func(b *testing.B) {
			o := openBench(b)
			first, _ := fillBacklog(b, o, pending+b.N)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := o.Remove(first + uint64(i)); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			if st := o.Stats(); st.Pending != pending {
				b.Fatalf("Stats.Pending = %d, want %d", st.Pending, pending)
			}
		})
	}
}

// BenchmarkRead reads 100-record pages from the front of a 100k backlog.
func BenchmarkRead(b *testing.B) {
	o := openBench(b)
	const pending, page = 100_000, 100
	first, _ := fillBacklog(b, o, pending)
	b.ResetTimer()
	after := first - 1
	for i := 0; i < b.N; i++ {
		recs, err := o.Read(after, page)
		if err != nil {
			b.Fatal(err)
		}
		if len(recs) < page {
			after = first - 1
			continue
		}
		after = recs[len(recs)-1].Seq
	}
	b.ReportMetric(float64(b.N*page)/b.Elapsed().Seconds(), "records/s")
}

func openBench(b *testing.B) *Outbox {
	return openT(b, filepath.Join(b.TempDir(), "out.db"), Options{})
}

// BenchmarkOpenVerify measures opening an outbox of 100k or 1M pending
// records with verify_on_start always (every page read, bbolt's Tx.Check,
// the record count) and never, from a warm page cache.
func BenchmarkOpenVerify(b *testing.B) {
	for _, pending := range []int{100_000, 1_000_000} {
		path := filepath.Join(b.TempDir(), "out.db")
		o := openT(b, path, Options{})
		fillBacklog(b, o, pending)
		if err := o.Close(); err != nil {
			b.Fatal(err)
		}
		benchtest.OpenVerify(b, fmt.Sprintf("pending=%d", pending), path, func(v boltfile.Verify) error {
			o, err := Open(path, Options{Verify: v})
			if err != nil {
				return err
			}
			return o.Close()
		})
	}
}

// BenchmarkOpenAfterDrain measures the open that compacts a drained
// outbox (boltfile's compaction at open): `pending` records were appended
// and all but 1,000 removed. It reports the file's size before and after.
func BenchmarkOpenAfterDrain(b *testing.B) {
	for _, pending := range []int{200_000} {
		b.Run(fmt.Sprintf("appended=%d", pending), func(b *testing.B) {
			var before, after int64
			var elapsed time.Duration
			for i := 0; i < b.N; i++ {
				path := filepath.Join(b.TempDir(), "out.db")
				o := openT(b, path, Options{})
				first, last := fillBacklog(b, o, pending)
				seqs := make([]uint64, 0, 10_000)
				for s := first; s <= last-1000; s++ {
					if seqs = append(seqs, s); len(seqs) == cap(seqs) {
						if err := o.Remove(seqs...); err != nil {
							b.Fatal(err)
						}
						seqs = seqs[:0]
					}
				}
				if err := o.Remove(seqs...); err != nil {
					b.Fatal(err)
				}
				if err := o.Close(); err != nil {
					b.Fatal(err)
				}
				st, _ := os.Stat(path)
				before = st.Size()
				t0 := time.Now()
				o, err := Open(path, Options{})
				if err != nil {
					b.Fatal(err)
				}
				elapsed += time.Since(t0)
				if st := o.Stats(); st.Pending != 1000 {
					b.Fatalf("Pending = %d after compaction, want 1000", st.Pending)
				}
				if err := o.Close(); err != nil {
					b.Fatal(err)
				}
				st, _ = os.Stat(path)
				after = st.Size()
			}
			b.ReportMetric(float64(elapsed.Milliseconds())/float64(b.N), "open_ms")
			b.ReportMetric(float64(before)/(1<<20), "MiB_before")
			b.ReportMetric(float64(after)/(1<<20), "MiB_after")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// BenchmarkRemove1024 is the committer's CPU for removing 1,024 confirmed
// records (one full transaction) from 4,096 pending: the transaction is
// rolled back, so no fsync is timed and every round removes the same ones.
func BenchmarkRemove1024(b *testing.B) {
	o := openT(b, filepath.Join(b.TempDir(), "out.db"), Options{})
	entries := make([]Entry, 4096)
	for i := range entries {
		entries[i] = Entry{Event: mqttmsg.Event{EventID: fmt.Sprintf("e%d", i), Topic: "bench/topic", Payload: benchPayload}}
	}
	recs, errs := o.AppendBatch(context.Background(), entries)
	seqs := make([]uint64, 1024)
	for i := range seqs {
		if errs[i] != nil {
			b.Fatal(errs[i])
		}
		seqs[i] = recs[i].Seq
	}
	errRollback := fmt.Errorf("roll back")
	b.ReportAllocs()
	for b.Loop() {
		err := o.file.Update(func(tx *bolt.Tx) error {
			n, _, err := o.remove(tx, seqs, &delta{})
			if err == nil && n != len(seqs) {
				err = fmt.Errorf("removed %d of %d", n, len(seqs))
			}
			if err == nil {
				err = errRollback
			}
			return err
		})
		if err != errRollback {
			b.Fatal(err)
		}
	}
}
