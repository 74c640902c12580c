package harness

import (
	"context"
	"database/sql"
	"os"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
)

// TestPostgresServesSeparateDatabasesAndStops starts a cluster, writes in
// its default database and in a second one, checks they are separate, and
// checks that after Stop nothing answers and the directory goes at cleanup.
func TestPostgresServesSeparateDatabasesAndStops(t *testing.T) {
	p := StartPostgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	open := func(dsn string) *sql.DB {
		db, err := sql.Open("pgx", dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	}
	main := open(p.DSN())
	if _, err := main.ExecContext(ctx, `CREATE TABLE t (v int); INSERT INTO t VALUES (7)`); err != nil {
		t.Fatalf("write to %s: %v", p.DSN(), err)
	}
	var v int
	if err := main.QueryRowContext(ctx, `SELECT v FROM t`).Scan(&v); err != nil || v != 7 {
		t.Fatalf("read back: v=%d err=%v", v, err)
	}
	var user string
	if err := main.QueryRowContext(ctx, `SELECT current_user`).Scan(&user); err != nil || user != "postgres" {
		t.Fatalf("current_user = %q, %v; want postgres", user, err)
	}

	other := open(p.NewDatabase(t))
	var n int
	err := other.QueryRowContext(ctx, `SELECT count(*) FROM information_schema.tables WHERE table_name = 't'`).Scan(&n)
	if err != nil || n != 0 {
		t.Fatalf("new database sees %d tables named t (err %v); want 0", n, err)
	}

	p.Stop()
	main.SetMaxIdleConns(0) // force a new connection
	if err := main.PingContext(ctx); err == nil {
		t.Fatal("server still answers after Stop")
	}
	p.Stop() // a second Stop is harmless
}

// TestPostgresCleanupRemovesCluster: when the test that started the
// cluster ends, the server is down and its directory is gone.
func TestPostgresCleanupRemovesCluster(t *testing.T) {
	var dir, dsn string
	t.Run("start", func(t *testing.T) {
		p := StartPostgres(t)
		dir, dsn = p.dir, p.DSN()
	})
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("cluster dir %s still there after cleanup (stat err %v)", dir, err)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err == nil {
		t.Fatalf("server at %s still answers after cleanup", dsn)
	}
}

// TestPostgresPairReplicatesSynchronouslyAndPromotes: the multi-host DSN
// reaches the primary; the standby is read-only and has each acknowledged
// commit; after the primary is SIGKILLed nothing is read-write, and after
// Promote the same DSN reaches the former standby with every committed row.
func TestPostgresPairReplicatesSynchronouslyAndPromotes(t *testing.T) {
	pp := StartPostgresPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	db, err := sql.Open("pgx", pp.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var sync, fsync string
	if err := db.QueryRowContext(ctx, `SELECT current_setting('synchronous_standby_names'), current_setting('fsync')`).Scan(&sync, &fsync); err != nil || sync != "*" || fsync != "on" {
		t.Fatalf("primary settings: synchronous_standby_names=%q fsync=%q err=%v", sync, fsync, err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE t (v int)`); err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		if _, err := db.ExecContext(ctx, `INSERT INTO t VALUES ($1)`, i); err != nil {
			t.Fatal(err)
		}
	}
	var state string
	if err := db.QueryRowContext(ctx, `SELECT sync_state FROM pg_stat_replication`).Scan(&state); err != nil || state != "sync" {
		t.Fatalf("replication state %q (err %v), want sync", state, err)
	}

	pp.Primary.Kill()
	db.SetMaxIdleConns(0)
	short, cancelShort := context.WithTimeout(ctx, 5*time.Second)
	err = db.PingContext(short)
	cancelShort()
	if err == nil {
		t.Fatal("the multi-host DSN reached a read-write server with the primary dead and the standby not promoted")
	}
	pp.Standby.Promote()
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM t`).Scan(&n); err != nil || n != 50 {
		t.Fatalf("after promotion: %d rows (err %v), want 50", n, err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO t VALUES (50)`); err != nil {
		t.Fatalf("write after promotion: %v", err)
	}
}
