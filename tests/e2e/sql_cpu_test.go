package e2e

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// CompareConnsEnv, set to a number N, makes TestSQLConsumerCPUPerEvent also
// measure this build with sql.max_open_conns: N.
const CompareConnsEnv = "RELIABLE_MQTT_CPU_CONNS"

// MeasureCPUEnv=1 runs TestSQLConsumerCPUPerEvent for this build alone;
// ./tests/run leaves it out (TestSQLConsumerGroupScalesAndCountsExactlyUnderKills checks the same
// exactness).
const MeasureCPUEnv = "RELIABLE_MQTT_CPU"

// BeforeBinaryEnv names a reliable-mqtt binary built from an earlier
// commit; TestSQLConsumerCPUPerEvent then measures it too, interleaved.
const BeforeBinaryEnv = "RELIABLE_MQTT_BEFORE_BIN"

// CompareEnvEnv, set to NAME=VALUE (e.g. GOGC=400), makes
// TestSQLConsumerCPUPerEvent also measure this build run with that
// environment variable.
const CompareEnvEnv = "RELIABLE_MQTT_CPU_ENV"

// ProfileDirEnv names a directory: TestSQLConsumerCPUPerEvent then serves
// /debug/pprof on every consumer of this build and writes each one's CPU
// profile of the run there (round-build-driver-i.pprof), to see where the
// CPU per event goes (`go tool pprof -top <binary> <file>`).
const ProfileDirEnv = "RELIABLE_MQTT_CPU_PROFILE"

// RoundsEnv overrides how many rounds TestSQLConsumerCPUPerEvent runs
// (default 2); the medians steady with more on a busy machine.
const RoundsEnv = "RELIABLE_MQTT_CPU_ROUNDS"

// EventsEnv overrides how many events each run applies (default 3,000);
// a profile wants more, so that the run outlasts start-up.
const EventsEnv = "RELIABLE_MQTT_CPU_EVENTS"

// TestSQLConsumerCPUPerEvent measures the CPU one applied event costs:
// the consumers (reliable_mqtt_in → dedup_ledger with the counter in
// sql.apply → ACK), and the PostgreSQL server, which runs durably (fsync
// and synchronous_commit on). Two consumers on $share/g/events/in share a
// PostgreSQL ledger; one consumer has an SQLite ledger (its CPU includes
// SQLite's). 3,000 distinct events (by default) are queued for the sessions before the
// consumers start; measureGroup takes the window from 10% to 90% applied.
//
// With RELIABLE_MQTT_BEFORE_BIN set, every round measures that binary and
// this one, alternating, on the same servers, and the ratios are logged;
// with RELIABLE_MQTT_CPU_CONNS=N also this one with max_open_conns: N;
// with RELIABLE_MQTT_CPU_ENV=NAME=VALUE also this one with that variable
// set. RELIABLE_MQTT_CPU_ROUNDS, RELIABLE_MQTT_CPU_EVENTS and
// RELIABLE_MQTT_CPU_PROFILE change the rounds and events and take
// profiles (see their constants).
// Asserted: each run applies every event exactly once. The CPU figures
// are logged, not asserted.
//
//	RELIABLE_MQTT_BEFORE_BIN=/tmp/old/reliable-mqtt go test -count=1 -v -run TestSQLConsumerCPUPerEvent ./tests/e2e/
func TestSQLConsumerCPUPerEvent(t *testing.T) {
	if os.Getenv(MeasureCPUEnv) == "" && os.Getenv(BeforeBinaryEnv) == "" {
		t.Skipf("a measurement (about 70 s), not a check the group tests lack: set %s=1 or %s to run it", MeasureCPUEnv, BeforeBinaryEnv)
	}
	rounds, n := harness.EnvCount(t, RoundsEnv, 2), harness.EnvCount(t, EventsEnv, 3000)
	profDir := os.Getenv(ProfileDirEnv)
	type build struct {
		name, bin string
		conns     int    // sql.max_open_conns; 0: the default
		env       string // NAME=VALUE for the consumers, or ""
	}
	builds := []build{{"this", "", 0, ""}}
	if b := os.Getenv(BeforeBinaryEnv); b != "" {
		builds = []build{{"before", b, 0, ""}, {"this", "", 0, ""}}
	}
	if n := harness.EnvCount(t, CompareConnsEnv, 0); n > 0 {
		builds = append(builds, build{fmt.Sprintf("this, max_open_conns %d", n), "", n, ""})
	}
	if e := os.Getenv(CompareEnvEnv); e != "" {
		builds = append(builds, build{"this, " + e, "", 0, e})
	}
	pg := harness.StartPostgresDurable(t)
	samples := map[string][]groupSample{} // build/driver
	run := 0
	for round := range rounds {
		for bi := range builds {
			// Alternate which build goes first, so neither always gets the
			// quieter moment.
			b := builds[(bi+round)%len(builds)]
			for _, driver := range []string{"postgres", "sqlite"} {
				run++
				m := harness.StartMosquitto(t, harness.MosquittoOptions{})
				consumers, dsn, dbPid := 2, pg.NewDatabase(t), pg.Pid()
				if driver == "sqlite" {
					consumers, dsn, dbPid = 1, filepath.Join(t.TempDir(), "ledger.db"), 0
				}
				const filter = "$share/g/events/in"
				cfgs := make([]sqlCounter, consumers)
				for i := range cfgs {
					id := fmt.Sprintf("cpu-%d-%d", run, i)
					harness.Subscribe(t, m.URL(), id, false, filter).Close()
					cfgs[i] = sqlCounter{url: m.URL(), clientID: id, topic: filter, driver: driver, dsn: dsn, quiet: true, bin: b.bin, env: b.env, threads: cpuThreads, conns: b.conns}
					if profDir != "" && b.bin == "" {
						cfgs[i].debugPort = harness.FreePort(t)
					}
				}
				for from := 1; from <= n; from += 500 {
					var events [][]byte
					for i := from; i < from+500 && i <= n; i++ {
						events = append(events, ledgerEvent(fmt.Sprintf("m-%d", i)))
					}
					harness.Publish(t, m.URL(), "events/in", events)
				}
				procs := runConsumers(t, cfgs)
				profiled := profileConsumers(t, cfgs, filepath.Join(profDir, fmt.Sprintf("%d-%s-%s", round+1, strings.ReplaceAll(b.name, " ", ""), driver)))
				s := measureGroup(t, driver, dsn, n, procs, m.Pid(), dbPid)
				profiled()
				for _, p := range procs {
					if err := p.Stop(15 * time.Second); err != nil {
						t.Error(err)
					}
				}
				if counter, rows := sqlState(t, driver, dsn); counter != int64(n) || rows != int64(n) {
					t.Fatalf("%s %s: counter = %d, ledger rows = %d; want exactly %d", b.name, driver, counter, rows, n)
				}
				key := b.name + "/" + driver
				samples[key] = append(samples[key], s)
				t.Logf("round %d, %s, %s: %.0f events/s, consumer %d µs, database %d µs, mosquitto %d µs per event",
					round+1, b.name, driver, s.rate, s.consumer.Microseconds(), s.database.Microseconds(), s.broker.Microseconds())
				m.Kill()
			}
		}
	}
	median := func(ss []groupSample, f func(groupSample) float64) float64 {
		v := make([]float64, len(ss))
		for i, s := range ss {
			v[i] = f(s)
		}
		sort.Float64s(v)
		if len(v)%2 == 1 {
			return v[len(v)/2]
		}
		return (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	cons := func(s groupSample) float64 { return float64(s.consumer.Microseconds()) }
	db := func(s groupSample) float64 { return float64(s.database.Microseconds()) }
	rate := func(s groupSample) float64 { return s.rate }
	var out strings.Builder
	fmt.Fprintf(&out, "| build | ledger | applied events/s | consumer CPU per event | PostgreSQL CPU per event |\n|---|---|---|---|---|\n")
	for _, driver := range []string{"postgres", "sqlite"} {
		for _, b := range builds {
			ss := samples[b.name+"/"+driver]
			fmt.Fprintf(&out, "| %s | %s | %.0f | %.0f µs | %.0f µs |\n", b.name, driver, median(ss, rate), median(ss, cons), median(ss, db))
		}
		if len(samples["before/"+driver]) > 0 {
			bf, af := samples["before/"+driver], samples["this/"+driver]
			fmt.Fprintf(&out, "| this / before | %s | %.2f | %.2f | %.2f |\n", driver,
				median(af, rate)/median(bf, rate), median(af, cons)/median(bf, cons), safeRatio(median(af, db), median(bf, db)))
		}
	}
	t.Logf("CPU per applied event (medians of %d rounds, %d events each; PostgreSQL with fsync on, 2 consumers; SQLite 1 consumer):\n%s", rounds, n, out.String())
}

// cpuThreads is pipeline.threads for the measurement: at least
// Mosquitto's in-flight window (20), so that every message the broker lets
// a consumer hold can wait in the ledger's next group.
const cpuThreads = 24

func safeRatio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// profileConsumers starts a CPU profile of profileSeconds on every
// consumer that serves /debug/pprof and returns a function that waits for
// them and writes each to prefix-<i>.pprof, and what it allocated to
// prefix-<i>.allocs.pprof.
func profileConsumers(t *testing.T, cfgs []sqlCounter, prefix string) (wait func()) {
	t.Helper()
	var wg sync.WaitGroup
	for i, c := range cfgs {
		if c.debugPort == 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			url := fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/profile?seconds=%d", c.debugPort, profileSeconds)
			if !harness.Poll(30*time.Second, func() bool {
				resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/ping", c.debugPort))
				if err == nil {
					resp.Body.Close()
				}
				return err == nil
			}) {
				t.Errorf("consumer %s: its HTTP server did not answer within 30s", c.clientID)
				return
			}
			resp, err := http.Get(url)
			if err != nil {
				t.Errorf("profile of %s: %v", c.clientID, err)
				return
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Errorf("profile of %s: %v", c.clientID, err)
				return
			}
			name := fmt.Sprintf("%s-%d.pprof", prefix, i)
			if err := os.WriteFile(name, body, 0o644); err != nil {
				t.Error(err)
			}
			t.Logf("CPU profile of %s: %s", c.clientID, name)
			// And what it allocated since it started.
			if resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/allocs", c.debugPort)); err == nil {
				body, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err == nil {
					err = os.WriteFile(fmt.Sprintf("%s-%d.allocs.pprof", prefix, i), body, 0o644)
				}
				if err != nil {
					t.Error(err)
				}
			}
		}()
	}
	return wg.Wait
}

// profileSeconds is how long each profile runs, from when the consumer
// answers; with EventsEnv, make the run last about that long.
const profileSeconds = 15
