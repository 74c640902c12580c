package harness

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// pgStartTimeout bounds initdb plus pg_ctl start (which waits until the
// server accepts connections).
const pgStartTimeout = 60 * time.Second

// pgCommandTimeout bounds createdb and pg_ctl stop.
const pgCommandTimeout = 20 * time.Second

// Postgres is a throwaway PostgreSQL cluster on 127.0.0.1, run from
// Debian's postgresql package as a non-root user. StartPostgres builds it
// for testing transaction semantics, not durability: fsync is off.
// StartPostgresPair builds a durable primary and its synchronous standby.
type Postgres struct {
	t      testing.TB
	bin    string // directory holding initdb, pg_ctl, createdb
	dir    string // owned by the server's user: data/, sock/, log
	port   int
	db     string // the database StartPostgres created
	cred   *syscall.Credential
	nextDB atomic.Int64
	stop   sync.Once
}

// StartPostgres initialises a cluster in a fresh temporary directory,
// starts it on a free port, creates a database and returns. t.Cleanup
// stops the server (immediate mode) and removes the directory.
func StartPostgres(t testing.TB) *Postgres {
	t.Helper()
	p := newPostgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), pgStartTimeout)
	defer cancel()
	p.run(ctx, "initdb", "-D", p.dataDir(), "-A", "trust", "-U", "postgres",
		"--no-sync", "-E", "UTF8", "--locale=C")
	p.start(ctx, "-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off")
	if err := p.createdb(ctx, p.db); err != nil {
		t.Fatalf("harness: %v", err)
	}
	return p
}

// StartPostgresDurable is StartPostgres with PostgreSQL's durable
// defaults: fsync, synchronous_commit and full_page_writes on, so every
// commit waits for its WAL flush (shared by concurrent commits).
func StartPostgresDurable(t testing.TB) *Postgres {
	t.Helper()
	p := newPostgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), pgStartTimeout)
	defer cancel()
	p.run(ctx, "initdb", "-D", p.dataDir(), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C")
	p.start(ctx, "-c fsync=on", "-c synchronous_commit=on", "-c full_page_writes=on")
	if err := p.createdb(ctx, p.db); err != nil {
		t.Fatalf("harness: %v", err)
	}
	return p
}

// PostgresPair is a primary and a hot standby that streams its WAL,
// made with pg_basebackup -R: durable (fsync on, full_page_writes on) and
// with synchronous replication (synchronous_standby_names = '*',
// synchronous_commit = on), so a commit the primary acknowledges has been
// flushed by the standby too. Promote the standby when the primary dies.
type PostgresPair struct {
	Primary, Standby *Postgres
}

// StartPostgresPair starts the primary, copies it with pg_basebackup -R
// into the standby, starts the standby and creates the database (whose
// commit waits for the standby, so it returns once replication is
// synchronous).
func StartPostgresPair(t testing.TB) *PostgresPair {
	t.Helper()
	pri, sby := newPostgres(t), newPostgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*pgStartTimeout)
	defer cancel()
	pri.run(ctx, "initdb", "-D", pri.dataDir(), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C")
	durable := []string{"-c fsync=on", "-c full_page_writes=on", "-c synchronous_commit=on", "-c wal_level=replica"}
	pri.start(ctx, append(durable, "-c synchronous_standby_names='*'")...)
	// -R writes standby.signal and primary_conninfo; -X stream copies the
	// WAL written meanwhile.
	sby.run(ctx, "pg_basebackup", "-h", filepath.Join(pri.dir, "sock"), "-p", strconv.Itoa(pri.port),
		"-U", "postgres", "-D", sby.dataDir(), "-R", "-X", "stream", "-c", "fast")
	sby.start(ctx, append(durable, "-c hot_standby=on", "-c cluster_name=standby")...)
	if err := pri.createdb(ctx, pri.db); err != nil {
		t.Fatalf("harness: %v\nprimary log:\n%s\nstandby log:\n%s", err, pri.logTail(), sby.logTail())
	}
	sby.db = pri.db
	return &PostgresPair{Primary: pri, Standby: sby}
}

// DSN is the multi-host URL of the pair's database: a client with it
// connects to whichever of the two is read-write.
func (pp *PostgresPair) DSN() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/%s?target_session_attrs=read-write&sslmode=disable",
		pp.Primary.port, pp.Standby.port, pp.Primary.db)
}

// Promote makes the standby a primary (pg_ctl promote, waiting until it
// accepts writes).
func (p *Postgres) Promote() {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), pgStartTimeout)
	defer cancel()
	p.run(ctx, "pg_ctl", "-D", p.dataDir(), "-w", "-t", strconv.Itoa(int(pgStartTimeout/time.Second)), "promote")
}

// Kill SIGKILLs the postmaster and every process of the server (a machine
// that dies takes its backends with it).
func (p *Postgres) Kill() {
	p.t.Helper()
	pid := p.Pid()
	if pid == 0 {
		p.t.Fatal("harness: kill postgres: not running")
	}
	for _, q := range descendants(pid) {
		_ = syscall.Kill(q, syscall.SIGKILL)
	}
	p.stop.Do(func() {}) // nothing left for pg_ctl stop
}

// newPostgres prepares a server's directory, owned by its user.
func newPostgres(t testing.TB) *Postgres {
	t.Helper()
	p := &Postgres{t: t, bin: postgresBin(t), db: "harness", cred: postgresCredential(t)}
	dir, err := os.MkdirTemp("", "harness-postgres-")
	if err != nil {
		t.Fatalf("harness: postgres temp dir: %v", err)
	}
	p.dir = dir
	t.Cleanup(func() { os.RemoveAll(dir) })
	if p.cred != nil {
		if err := os.Chown(dir, int(p.cred.Uid), int(p.cred.Gid)); err != nil {
			t.Fatalf("harness: give %s to the postgres user: %v", dir, err)
		}
	}
	p.mkdir(filepath.Join(dir, "sock"))
	return p
}

// start starts the server on a free port with settings (-c name=value).
// A port found free may be taken before the server binds it; it tries a
// few times rather than fail the test on that race.
func (p *Postgres) start(ctx context.Context, settings ...string) {
	p.t.Helper()
	var startErr error
	for range 3 {
		p.port = FreePort(p.t)
		opts := strings.Join(append([]string{
			"-p " + strconv.Itoa(p.port),
			"-c listen_addresses=127.0.0.1",
			"-c unix_socket_directories=" + filepath.Join(p.dir, "sock"),
			"-c max_connections=200",
		}, settings...), " ")
		startErr = p.try(ctx, "pg_ctl", "-D", p.dataDir(), "-l", p.logPath(),
			"-o", opts, "-w", "-t", strconv.Itoa(int(pgStartTimeout/time.Second)), "start")
		if startErr == nil {
			break
		}
	}
	if startErr != nil {
		p.t.Fatalf("harness: start postgres: %v\nserver log:\n%s", startErr, p.logTail())
	}
	p.t.Cleanup(p.Stop)
}

// descendants is pid and every live process below it.
func descendants(pid int) []int {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	children := map[int][]int{}
	for _, d := range dirs {
		q, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		if ppid, _, err := procStat(q); err == nil {
			children[ppid] = append(children[ppid], q)
		}
	}
	out := []int{pid}
	for i := 0; i < len(out) && i < 10000; i++ {
		out = append(out, children[out[i]]...)
	}
	return out
}

// DSN is the URL of the database StartPostgres created.
func (p *Postgres) DSN() string { return p.dsnFor(p.db) }

// Port is the TCP port the server listens on (127.0.0.1).
func (p *Postgres) Port() int { return p.port }

// Pid is the postmaster's process id (its backends are its children), read
// from postmaster.pid; 0 if the server is not running.
func (p *Postgres) Pid() int {
	b, err := os.ReadFile(filepath.Join(p.dataDir(), "postmaster.pid"))
	if err != nil {
		return 0
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, _ := strconv.Atoi(strings.TrimSpace(first))
	return pid
}

// NewDatabase creates another empty database in the cluster and returns its
// DSN, so tests sharing one cluster do not see each other's tables.
func (p *Postgres) NewDatabase(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("db%d", p.nextDB.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), pgCommandTimeout)
	defer cancel()
	if err := p.createdb(ctx, name); err != nil {
		t.Fatalf("harness: %v", err)
	}
	return p.dsnFor(name)
}

// Stop shuts the server down at once (pg_ctl stop -m immediate). Safe to
// call more than once.
func (p *Postgres) Stop() {
	p.stop.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), pgCommandTimeout)
		defer cancel()
		if err := p.try(ctx, "pg_ctl", "-D", p.dataDir(), "-m", "immediate", "-w", "stop"); err != nil {
			p.t.Logf("harness: stop postgres: %v", err)
		}
	})
}

func (p *Postgres) dsnFor(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", p.port, db)
}

func (p *Postgres) dataDir() string { return filepath.Join(p.dir, "data") }
func (p *Postgres) logPath() string { return filepath.Join(p.dir, "log") }

// createdb creates database name; the error names it (the tool's command
// line) and carries the tool's output.
func (p *Postgres) createdb(ctx context.Context, name string) error {
	return p.try(ctx, "createdb", "-h", filepath.Join(p.dir, "sock"), "-p", strconv.Itoa(p.port), "-U", "postgres", name)
}

func (p *Postgres) mkdir(path string) {
	if err := os.Mkdir(path, 0o700); err != nil {
		p.t.Fatalf("harness: %v", err)
	}
	if p.cred != nil {
		if err := os.Chown(path, int(p.cred.Uid), int(p.cred.Gid)); err != nil {
			p.t.Fatalf("harness: %v", err)
		}
	}
}

// run is try that fails the test.
func (p *Postgres) run(ctx context.Context, tool string, args ...string) {
	p.t.Helper()
	if err := p.try(ctx, tool, args...); err != nil {
		p.t.Fatalf("harness: %v", err)
	}
}

// try runs one of the cluster's tools as the server's user, in its
// directory (initdb complains when it cannot read the working directory).
func (p *Postgres) try(ctx context.Context, tool string, args ...string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(p.bin, tool), args...)
	cmd.Dir = p.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C", "PGTZ=UTC")
	if p.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred}
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v\n%s", tool, strings.Join(args, " "), err, out)
	}
	return nil
}

func (p *Postgres) logTail() string {
	b, err := os.ReadFile(p.logPath())
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// postgresBin finds the newest /usr/lib/postgresql/<version>/bin that has
// initdb and pg_ctl (Debian's layout).
func postgresBin(t testing.TB) string {
	t.Helper()
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	var dirs []string
	for _, m := range matches {
		d := filepath.Dir(m)
		if _, err := os.Stat(filepath.Join(d, "pg_ctl")); err == nil {
			dirs = append(dirs, d)
		}
	}
	if len(dirs) == 0 {
		t.Fatal("harness: PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin: apt-get install -y postgresql")
	}
	version := func(d string) int {
		v, _ := strconv.Atoi(filepath.Base(filepath.Dir(d)))
		return v
	}
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	return dirs[0]
}

// postgresCredential: PostgreSQL refuses to run as root, so as root the
// tools run as the `postgres` user the Debian package creates, or nobody.
// Not root: run as ourselves (nil).
func postgresCredential(t testing.TB) *syscall.Credential {
	t.Helper()
	if os.Geteuid() != 0 {
		return nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, err1 := strconv.Atoi(u.Uid)
		gid, err2 := strconv.Atoi(u.Gid)
		if err1 != nil || err2 != nil {
			continue
		}
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}
	}
	t.Fatal("harness: running as root and neither a postgres nor a nobody user exists to run PostgreSQL as: apt-get install -y postgresql")
	return nil
}
