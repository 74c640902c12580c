package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/sqlledger"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// groupSample is what one consumer-group size measured.
type groupSample struct {
	consumers int
	rate      float64       // events applied per second
	consumer  time.Duration // CPU per event: the consumer processes
	broker    time.Duration // CPU per event: mosquitto
	database  time.Duration // CPU per event: the PostgreSQL server
	kills     int
}

// TestSQLConsumerGroupScalesAndCountsExactlyUnderKills: a consumer group
// of 1, 2 and 4 consumer processes on $share/g/events/in, each group on a
// fresh mosquitto and a fresh database of one PostgreSQL server (ledger
// and counter in one transaction per event), pipeline.threads: 24
// (cpuThreads).
//
// Measured: `measured` distinct events are queued for the group's
// sessions, then the consumers start; the rate is taken between 10% and
// 90% applied (no process start-up, no tail), with the CPU time the
// consumers, mosquitto and PostgreSQL used in that window, per event.
//
// Asserted, after a second batch published one to three times per event
// while consumers are SIGKILLed at random moments and restarted: the
// counter and the ledger rows equal the number of distinct events exactly.
// The rates are logged, not asserted (they depend on the machine).
func TestSQLConsumerGroupScalesAndCountsExactlyUnderKills(t *testing.T) {
	const measured, chaos = 3000, 300
	pg := harness.StartPostgres(t)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 23))
	var samples []groupSample
	for _, k := range []int{1, 2, 4} {
		m := harness.StartMosquitto(t, harness.MosquittoOptions{})
		dsn := pg.NewDatabase(t)
		const filter = "$share/g/events/in"
		for i := range k {
			harness.Subscribe(t, m.URL(), fmt.Sprintf("group-%d-%d", k, i), false, filter).Close()
		}
		for from := 1; from <= measured; from += 500 {
			var events [][]byte
			for i := from; i < from+500 && i <= measured; i++ {
				events = append(events, ledgerEvent(fmt.Sprintf("m-%d", i)))
			}
			harness.Publish(t, m.URL(), "events/in", events)
		}
		cfgs := make([]sqlCounter, k)
		for i := range k {
			cfgs[i] = sqlCounter{url: m.URL(), clientID: fmt.Sprintf("group-%d-%d", k, i), topic: filter, driver: "postgres", dsn: dsn, quiet: true, threads: cpuThreads}
		}
		procs := runConsumers(t, cfgs)
		s := measureGroup(t, "postgres", dsn, measured, procs, m.Pid(), pg.Pid())

		// Chaos: duplicates in the stream, consumers killed and restarted.
		published := publishStream(t, m.URL(), dupStream(rng, chaos), 20, 50*time.Millisecond)
		s.kills = 2 * k
		killWhilePublishing(t, rng, published, s.kills, func(int) *harness.Proc { return procs[rng.IntN(k)] })
		want := int64(measured + chaos)
		harness.Eventually(t, 90*time.Second, fmt.Sprintf("%d consumers: all %d events applied", k, want), func() bool {
			c, _ := sqlState(t, "postgres", dsn)
			return c >= want
		})
		time.Sleep(2 * time.Second) // redeliveries after the last kill arrive
		for _, p := range procs {
			if err := p.Stop(15 * time.Second); err != nil {
				t.Error(err)
			}
		}
		counter, rows := sqlState(t, "postgres", dsn)
		if counter != want || rows != want {
			t.Fatalf("%d consumers after %d kills: counter = %d, ledger rows = %d; want exactly %d each", k, s.kills, counter, rows, want)
		}
		if k == 4 {
			logLedgerSize(t, dsn, rows)
		}
		samples = append(samples, s)
		m.Kill()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "| consumers | applied events/s | consumer CPU per event | mosquitto CPU per event | PostgreSQL CPU per event | kills, counter exact |\n|---|---|---|---|---|---|\n")
	for _, s := range samples {
		fmt.Fprintf(&b, "| %d | %.0f | %d µs | %d µs | %d µs | %d, yes |\n", s.consumers, s.rate,
			s.consumer.Microseconds(), s.broker.Microseconds(), s.database.Microseconds(), s.kills)
	}
	t.Logf("consumer group on $share/g/events/in, %d events per measurement, PostgreSQL ledger + counter:\n%s", measured, b.String())
}

// runConsumers starts one consumer per config, the first one alone until
// its pipeline is up: PostgreSQL's CREATE TABLE IF NOT EXISTS is not safe
// against a concurrent one (both can pass the check and one fails on the
// catalog's unique index), and init_statements do not retry.
func runConsumers(t *testing.T, cfgs []sqlCounter) []*harness.Proc {
	t.Helper()
	procs := make([]*harness.Proc, len(cfgs))
	for i, cfg := range cfgs {
		o := harness.ProcOptions{Binary: cfg.bin}
		if cfg.env != "" {
			o.Env = []string{cfg.env}
		}
		procs[i] = harness.RunPipeline(t, cfg.yaml(), o)
		if i == 0 && !procs[0].WaitForLog("Output type drop is now active", 60*time.Second) {
			t.Fatalf("consumer %s did not start its pipeline within 60s", cfg.clientID)
		}
	}
	return procs
}

// killWhilePublishing SIGKILLs and restarts kills consumers, pick(k)
// choosing the k-th, at random moments 200-700 ms apart, then waits up to
// 60 s for the publisher to finish.
func killWhilePublishing(t *testing.T, rng *rand.Rand, published <-chan struct{}, kills int, pick func(k int) *harness.Proc) {
	t.Helper()
	for k := range kills {
		time.Sleep(time.Duration(200+rng.IntN(500)) * time.Millisecond)
		p := pick(k)
		p.Kill()
		p.Restart()
	}
	select {
	case <-published:
	case <-time.After(60 * time.Second):
		t.Fatal("publisher did not finish within 60s")
	}
}

// measureGroup waits until n events are applied and measures the rate and
// the CPU per event between 10% and 90% of them. pgPid 0: no database
// server (SQLite works inside the consumer).
func measureGroup(t *testing.T, driver, dsn string, n int, procs []*harness.Proc, brokerPid, pgPid int) groupSample {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	st, err := sqlledger.Open(ctx, sqlledger.Config{Driver: sqlledger.Driver(driver), DSN: dsn, Table: "dedup_ledger"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	type mark struct {
		at                         time.Time
		applied                    int
		consumer, broker, database time.Duration
	}
	sample := func(applied int) mark {
		mk := mark{at: time.Now(), applied: applied}
		for _, p := range procs {
			mk.consumer += treeCPU(t, p.Pid())
		}
		mk.broker = treeCPU(t, brokerPid)
		if pgPid != 0 {
			mk.database = treeCPU(t, pgPid)
		}
		return mk
	}
	var start, end *mark
	harness.Eventually(t, 3*time.Minute, fmt.Sprintf("%d consumers: %d events applied", len(procs), n), func() bool {
		var applied int
		if err := st.DB().QueryRowContext(ctx, "SELECT value FROM counter WHERE id = 1").Scan(&applied); err != nil {
			return false // the consumers have not created it yet
		}
		if start == nil && applied >= n/10 {
			mk := sample(applied)
			start = &mk
		}
		if start != nil && end == nil && applied >= n*9/10 {
			mk := sample(applied)
			end = &mk
		}
		return applied >= n
	})
	events := time.Duration(end.applied - start.applied)
	return groupSample{
		consumers: len(procs),
		rate:      float64(end.applied-start.applied) / end.at.Sub(start.at).Seconds(),
		consumer:  (end.consumer - start.consumer) / events,
		broker:    (end.broker - start.broker) / events,
		database:  (end.database - start.database) / events,
	}
}

func treeCPU(t *testing.T, pid int) time.Duration {
	t.Helper()
	cpu, err := harness.TreeCPU(pid)
	if err != nil {
		t.Fatalf("CPU time of pid %d: %v", pid, err)
	}
	return cpu
}

// logLedgerSize logs what the ledger table takes in PostgreSQL per row.
func logLedgerSize(t *testing.T, dsn string, rows int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := sqlledger.Open(ctx, sqlledger.Config{Driver: "postgres", DSN: dsn, Table: "dedup_ledger"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var heap, indexes int64
	if err := st.DB().QueryRowContext(ctx,
		"SELECT pg_relation_size('dedup_ledger'), pg_indexes_size('dedup_ledger')").Scan(&heap, &indexes); err != nil {
		t.Fatal(err)
	}
	t.Logf("ledger table: %d rows, heap %d bytes (%d per row), indexes %d bytes (%d per row)",
		rows, heap, heap/rows, indexes, indexes/rows)
}
