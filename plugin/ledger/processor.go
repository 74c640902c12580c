// Package ledger is the dedup_ledger processor: it passes the first copy of
// each event key and drops (or flags) later copies, recording a key as
// applied only when the message's effect is committed.
//
// It holds the Benthos glue only (spec, settings, metrics, lifecycle): what
// a copy's fate is, over either store, is internal/dedup; the stores are
// internal/ledger (bbolt) and internal/sqlledger.
package ledger

import (
	"errors"
	"fmt"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/reliable-mqtt/reliable-mqtt/internal/boltfile"
	"github.com/reliable-mqtt/reliable-mqtt/plugin/internal/conffield"
)

const (
	fieldPath        = "path"
	fieldKey         = "key"
	fieldNamespace   = "namespace"
	fieldOnDuplicate = "on_duplicate"
	fieldRetention   = "retention"
	fieldCommit      = "commit"
	fieldWaitTimeout = "wait_timeout"
	fieldSQL         = "sql"
	fieldVerify      = "verify_on_start"
	fieldRollback    = "accept_rollback"

	// The sql object's fields (sqlconfig.go); the ones sql_query shares
	// are sqlconf's.
	fieldSQLTable           = "table"
	fieldSQLApply           = "apply"
	fieldSQLMaxBatch        = "max_batch"
	fieldSQLMaxOpen         = "max_open_conns"
	fieldSQLMaxIdle         = "max_idle_conns"
	fieldSQLConnMaxLifetime = "conn_max_lifetime"
	fieldSQLConnectTimeout  = "connect_timeout"
	fieldSQLStartupWait     = "startup_wait"
	fieldSQLTxTimeout       = "transaction_timeout"
	fieldSQLBusyTimeout     = "busy_timeout"
	fieldSQLRetry           = "retry"
	fieldSQLRetryInitial    = "initial_interval"
	fieldSQLRetryMax        = "max_interval"
	fieldSQLRetryCount      = "max_retries"

	duplicateDrop   = "drop"
	duplicateFlag   = "flag"
	commitAuto      = "auto"
	commitImmediate = "immediate"

	// Metadata set on messages that pass flagged.
	metaDuplicate = "dedup_duplicate"
	metaConflict  = "dedup_conflict"
)

func processorSpec() *service.ConfigSpec {
	return service.NewConfigSpec().
		Stable().
		Categories("Utility").
		Summary("Passes each event once: later copies of an event key are dropped (or flagged), and a key is recorded as applied only when the message's effect is committed — never when the message merely passes.").
		Description(`
MQTT QoS 1 delivers at least once: a consumer that commits its effect and dies before its PUBACK gets the message again. This processor keeps a ledger of applied keys (`+"`namespace`"+` + `+"`key`"+`, usually the producer and its event ID) in a bbolt file and turns that redelivery into a duplicate it drops.

### When a key becomes applied

A key is recorded only when the message's effect is committed. With `+"`commit: auto`"+` (the default):

- **Together with the output, in one transaction.** When a `+"`reliable_mqtt_out`"+` whose `+"`outbox.path`"+` is the same file as this `+"`path`"+` stores the message, the key is written in the same bbolt transaction as the outbox record. Either both are on disk or neither is, so a relay `+"`reliable_mqtt_in`"+` → `+"`dedup_ledger`"+` → `+"`reliable_mqtt_out`"+` enqueues each event exactly once, even when killed between any two steps. A copy that arrives later appends nothing and is acknowledged.
- **When the pipeline acknowledges the message.** `+"`reliable_mqtt_in`"+` gives every message a list of delivery hooks that run before it sends the PUBACK. On success the key is recorded (many keys share one fsync); on failure the claim is released, so the retried message passes again. The events of one frame (docs/frames.md) record the keys of those that succeeded in one transaction, even when another event of the frame failed: the frame comes back whole and only the failed events pass again. A crash between the output's effect and this commit lets the redelivered copy pass once more: exactly-once needs the effect and the key in one transaction (the first case).

With `+"`commit: auto`"+` a message must come from `+"`reliable_mqtt_in`"+` (it carries the delivery hooks); any other message fails with an error that says so. The processor cannot see which output follows it, so it does not guess: it never silently records keys early.

`+"`commit: immediate`"+` records the key inside the processor, before the output runs. This is what Benthos's `+"`dedupe`"+` does, and it voids at-least-once delivery: if the output then fails, the retried message is dropped as a duplicate and is lost. Use it only where losing a message is acceptable.

### Copies in flight, conflicts, errors

Two copies of one key are never both passed. While one copy is in flight (claimed, not yet committed or released) another copy waits up to `+"`wait_timeout`"+`: if the first commits, the second is a duplicate; if the first fails, the second passes; on timeout the second fails with an error and is retried later. Copies of one key inside a single batch share the batch's fate, so later ones are duplicates without waiting.

The ledger stores a SHA-256 hash of each payload. A copy whose payload differs from the applied one is a conflict (the producer reused an event ID): it passes with metadata `+"`dedup_conflict: true`"+` and a warning is logged; it is never treated as a duplicate and never recorded.

A message whose key is empty, or evaluates to `+"`null`"+` (what a missing metadata key interpolates to), or that cannot be checked, is flagged with an error like any processor error. Route errored messages away from your output (for example `+"`reject_errored`"+`, or a `+"`switch`"+` with `+"`check: errored()`"+`); a `+"`reliable_mqtt_out`"+` on the ledger's file refuses such messages by itself.

### SQL store (`+"`sql`"+`)

Instead of `+"`path`"+`, `+"`sql`"+` keeps the ledger in a table of SQLite (embedded, the default) or PostgreSQL (shared by several instances, e.g. behind a shared subscription `+"`$share/<group>/<filter>`"+`).

- **With `+"`sql.apply`"+`** the ledger insert and your statements run in ONE transaction, and the statements run only if that insert created the row (the key was new). The transaction commits in the processor, before the message moves on; the broker's acknowledgement still follows the pipeline's ack. A crash between the commit and the PUBACK brings the message back, and the copy finds its row: it is dropped (or flagged `+"`dedup_duplicate: true`"+`) and acknowledged. The effect happens exactly once in that database. Concurrent messages from all pipeline threads share transactions (up to `+"`max_batch`"+`, a savepoint each), and any input works, since the processor itself commits. `+"`commit`"+` and `+"`wait_timeout`"+` do not apply: the database decides between copies in flight.
- **Outputs after an apply.** The key is committed with the database effect, before the output runs. If the output then fails (or the process dies before it runs), the retried copy is a duplicate: with `+"`on_duplicate: drop`"+` the output never sees the message again, so anything the output does is at most once. Use `+"`on_duplicate: flag`"+` and let the output act on flagged copies too when its work must also happen, or keep the whole effect inside the transaction.
- **Failures.** An `+"`args_mapping`"+` that fails, a statement that fails, a constraint violation or a lost connection fails the message with the database's error; nothing of it is committed. Serialization failures, deadlocks and SQLITE_BUSY are retried with backoff (`+"`retry`"+`). Put `+"`reject_errored`"+` (or a `+"`switch`"+` on `+"`errored()`"+`) around your output so a failed message is not acknowledged (a bare `+"`drop`"+` acknowledges it) and the broker delivers it again.
- **Without `+"`apply`"+`** the SQL ledger works like the bbolt one: keys are recorded (group-committed) when `+"`reliable_mqtt_in`"+` sees the pipeline acknowledge, released on failure. In-process claims stop two local copies from both passing; copies at two instances at the same instant can both pass — use `+"`apply`"+` where that matters.
- The table is created if missing (`+"`namespace`"+`, `+"`key`"+`, `+"`hash`"+`, `+"`applied_at`"+`, primary key (`+"`namespace`"+`, `+"`key`"+`)), with `+"`<table>_clock`"+`, the one row of the ledger clock that `+"`applied_at`"+` is stamped with; `+"`retention`"+` deletes old rows in small batches.

### The file

The ledger lives in the bbolt file at `+"`path`"+`, which may be (and for exactly-once should be) the outbox file of the `+"`reliable_mqtt_out`"+` downstream. Every entry carries a CRC-32C checksum checked on every lookup: an entry that fails makes its message fail with an error naming the file and the key (it is never taken for "not applied"), and a file found damaged at start (`+"`verify_on_start`"+`) or rolled back to an earlier commit (`+"`accept_rollback`"+`) is refused. Keys older than `+"`retention`"+` are deleted in the background in small batches; a copy that arrives after its key expired passes again, so choose a retention longer than any redelivery you expect (broker session expiry, outbox backlog). Retention counts only time the ledger itself observed (its own clock, kept in the file, advanced by monotonic time while the ledger is open): a step of the wall clock, to 1970 or years ahead, never expires a key early (see docs/clocks.md). Metrics: `+"`dedup_ledger_passed`"+`, `+"`dedup_ledger_duplicates`"+`, `+"`dedup_ledger_conflicts`"+`, `+"`dedup_ledger_commits`"+`, `+"`dedup_ledger_releases`"+`, `+"`dedup_ledger_errors`"+`, `+"`dedup_ledger_written_bytes`"+` (what bbolt wrote to the file: flash wear), and the gauge `+"`dedup_ledger_keys`"+`; with `+"`sql`"+` also the gauge `+"`dedup_ledger_sql_available`"+` (0 while no read-write server answers) and `+"`dedup_ledger_sql_retries`"+` (transactions run again, label `+"`reason`"+`: `+"`unavailable`"+` or `+"`conflict`"+`).`).
		Fields(
			service.NewStringField(fieldPath).
				Description("Path of the bbolt ledger file. Use the `outbox.path` of the `reliable_mqtt_out` that follows to commit the key and the outbox record in one transaction. One process owns the file; its directory is created if missing. Set exactly one of `path` and `sql`.").
				Example("./data/bridge.db").
				Optional(),
			sqlField(),
			service.NewInterpolatedStringField(fieldKey).
				Description("The event key. An empty result, or `null` (a missing metadata key), fails the message.").
				Default(`${! meta("event_id") }`),
			service.NewInterpolatedStringField(fieldNamespace).
				Description("Optional namespace of the key, e.g. the producer. Keys are unique per namespace: the ledger key is the pair (namespace, key). A result of `null` fails the message.").
				Default("").
				Example(`${! json("producer") }`),
			service.NewStringAnnotatedEnumField(fieldOnDuplicate, map[string]string{
				duplicateDrop: "Drop duplicates (they are acknowledged).",
				duplicateFlag: "Pass duplicates with metadata `dedup_duplicate: true`. A `reliable_mqtt_out` on the ledger's file still never stores them.",
			}).Description("What to do with a copy of an applied key.").Default(duplicateDrop),
			service.NewDurationField(fieldRetention).
				Description("How long an applied key is remembered. `0s` remembers keys forever (the file grows without bound).").
				Default("168h"),
			service.NewStringAnnotatedEnumField(fieldCommit, map[string]string{
				commitAuto:      "Record the key when the effect is committed: in the outbox transaction of a `reliable_mqtt_out` on the same file, or when `reliable_mqtt_in` sees the pipeline acknowledge the message. Messages from other inputs fail.",
				commitImmediate: "Record the key in the processor, before the output runs (like Benthos's `dedupe`). A failed output then loses the message: this voids at-least-once delivery.",
			}).Description("When a key is recorded as applied.").Default(commitAuto),
			service.NewDurationField(fieldWaitTimeout).
				Description("How long a copy waits for another copy of the same key that is in flight before it fails (and is retried).").
				Default("10s").Advanced(),
			service.NewStringAnnotatedEnumField(fieldVerify, map[string]string{
				string(boltfile.VerifyAuto):   fmt.Sprintf("Check files up to %d MiB.", boltfile.AutoVerifyMaxBytes>>20),
				string(boltfile.VerifyAlways): "Check the file whatever its size.",
				string(boltfile.VerifyNever):  "Do not check; rely on the per-entry checksums checked on every lookup.",
			}).Description("With `path`: at start, read every page of the ledger file, run bbolt's consistency check, check every entry's checksum and compare the keys with the stored count; a damaged file is refused before any message is checked against it. The cost grows with the file (see docs/operations.md).").
				Default(string(boltfile.VerifyAuto)).Advanced(),
			service.NewBoolField(fieldRollback).
				Description("With `path`: start even though the file's newest meta page is damaged. bbolt then silently opens the previous commit, so the keys of the last commit are forgotten and their events, redelivered, are applied again. Without this the processor refuses to start and says how many commits back the file is. The next commit repairs the page: set it for one start only.").
				Default(false).Advanced(),
		).
		Example("Exactly-once relay", "Consume with a persistent session, drop redeliveries, and enqueue each event once: the ledger and the outbox share one file, so the key and the record commit together.", `
input:
  reliable_mqtt_in:
    urls: [ "tcp://127.0.0.1:1883" ]
    client_id: relay-1
    topics: [ "sensors/#" ]
    qos: 1
pipeline:
  processors:
    - dedup_ledger:
        path: ./data/relay.db
        key: ${! json("event_id") }
        namespace: ${! json("producer") }
output:
  reject_errored:
    reliable_mqtt_out:
      urls: [ "tcp://127.0.0.1:1883" ]
      topic: relayed/${! meta("mqtt_topic") }
      event_id: ${! json("event_id") }
      outbox:
        path: ./data/relay.db
`).
		Example("Counter in SQLite, exactly once", "Seed 001 as a pipeline: the ledger row and `value = value + delta` commit in one SQLite transaction before the message moves on; a redelivery after a crash between that commit and the PUBACK finds the row and is dropped. (For PostgreSQL write `$1` instead of `?`.)", `
input:
  reliable_mqtt_in:
    urls: [ "tcp://127.0.0.1:1883" ]
    client_id: counter-1
    clean_session: false
    topics: [ "events/in" ]
    qos: 1
pipeline:
  processors:
    - dedup_ledger:
        key: ${! json("event_id") }
        namespace: ${! json("producer") }
        sql:
          driver: sqlite
          dsn: ./data/counter.db
          init_statements:
            - CREATE TABLE IF NOT EXISTS counter (id INTEGER PRIMARY KEY, value INTEGER NOT NULL)
            - INSERT INTO counter (id, value) VALUES (1, 0) ON CONFLICT (id) DO NOTHING
          apply:
            - query: UPDATE counter SET value = value + ? WHERE id = 1
              args_mapping: root = [ this.delta ]
output:
  drop: {}
`).
		Example("Route conflicts to a dead-letter topic", "A reused event ID with different content is flagged, not dropped.", `
output:
  switch:
    cases:
      - check: meta("dedup_conflict") == "true"
        output:
          file:
            path: ./conflicts.jsonl
      - output:
          reliable_mqtt_out:
            urls: [ "tcp://127.0.0.1:1883" ]
            topic: events
            outbox:
              path: ./data/relay.db
`)
}

func init() {
	err := service.RegisterBatchProcessor("dedup_ledger", processorSpec(),
		func(conf *service.ParsedConfig, mgr *service.Resources) (service.BatchProcessor, error) {
			s, err := parseSettings(conf)
			if err != nil {
				return nil, err
			}
			if s.sql != nil {
				return newSQLProcessor(s, mgr)
			}
			return newProcessor(s, mgr)
		})
	if err != nil {
		panic(err)
	}
}

// settings is the parsed configuration.
type settings struct {
	path        string
	key         *service.InterpolatedString
	namespace   *service.InterpolatedString // nil when not set
	flag        bool
	retention   time.Duration
	immediate   bool
	waitTimeout time.Duration
	verify      boltfile.Verify
	rollback    bool         // accept_rollback
	sql         *sqlSettings // nil for the bbolt store
}

func parseSettings(conf *service.ParsedConfig) (s settings, err error) {
	// Exactly one store: a bbolt file or an SQL database.
	hasPath, hasSQL := conf.Contains(fieldPath), conf.Contains(fieldSQL)
	switch {
	case hasPath && hasSQL:
		return s, errors.New("dedup_ledger: set either path (a bbolt file) or sql (a database), not both")
	case !hasPath && !hasSQL:
		return s, errors.New("dedup_ledger: no ledger store: set path (a bbolt file; use the outbox.path of the reliable_mqtt_out that follows) or sql (a SQLite or PostgreSQL database)")
	case hasPath:
		if s.path, err = conf.FieldString(fieldPath); err != nil {
			return s, err
		}
		if s.path == "" {
			return s, errors.New("path is empty: give the bbolt file of the dedup ledger (use the outbox.path of the reliable_mqtt_out that follows), or use sql instead")
		}
	default:
		if s.sql, err = parseSQLSettings(conf.Namespace(fieldSQL)); err != nil {
			return s, err
		}
	}
	if s.key, err = conf.FieldInterpolatedString(fieldKey); err != nil {
		return s, err
	}
	if raw, _ := conf.FieldString(fieldNamespace); raw != "" {
		if s.namespace, err = conf.FieldInterpolatedString(fieldNamespace); err != nil {
			return s, err
		}
	}
	var dup, mode, verify string
	err = conffield.Read(conf,
		conffield.Enum(&dup, fieldOnDuplicate, duplicateDrop, duplicateFlag),
		conffield.Duration(&s.retention, fieldRetention),
		conffield.Enum(&mode, fieldCommit, commitAuto, commitImmediate),
		conffield.PositiveDuration(&s.waitTimeout, fieldWaitTimeout),
		conffield.Enum(&verify, fieldVerify, boltfile.VerifyValues...),
		conffield.Bool(&s.rollback, fieldRollback))
	if err != nil {
		return s, err
	}
	if s.retention < 0 {
		return s, fmt.Errorf("retention must not be negative, got %s", s.retention)
	}
	s.flag, s.immediate, s.verify = dup == duplicateFlag, mode == commitImmediate, boltfile.Verify(verify)
	return s, nil
}
