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
// Debian's postgresql package as a non-root user. It is built for testing
// transaction semantics, not durability: fsync is off.
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
	bin := postgresBin(t)
	p := &Postgres{t: t, bin: bin, db: "harness"}
	p.cred = postgresCredential(t)

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

	ctx, cancel := context.WithTimeout(context.Background(), pgStartTimeout)
	defer cancel()
	p.run(ctx, "initdb", "-D", p.dataDir(), "-A", "trust", "-U", "postgres",
		"--no-sync", "-E", "UTF8", "--locale=C")

	// A port found free may be taken before the server binds it; try a
	// few times rather than fail the test on that race.
	var startErr error
	for range 3 {
		p.port = FreePort(t)
		opts := strings.Join([]string{
			"-p " + strconv.Itoa(p.port),
			"-c listen_addresses=127.0.0.1",
			"-c unix_socket_directories=" + filepath.Join(dir, "sock"),
			"-c fsync=off",
			"-c synchronous_commit=off",
			"-c full_page_writes=off",
			"-c max_connections=200",
		}, " ")
		startErr = p.try(ctx, "pg_ctl", "-D", p.dataDir(), "-l", p.logPath(),
			"-o", opts, "-w", "-t", strconv.Itoa(int(pgStartTimeout/time.Second)), "start")
		if startErr == nil {
			break
		}
	}
	if startErr != nil {
		t.Fatalf("harness: start postgres: %v\nserver log:\n%s", startErr, p.logTail())
	}
	t.Cleanup(p.Stop)

	if err := p.createdb(ctx, p.db); err != nil {
		t.Fatalf("harness: %v", err)
	}
	return p
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
