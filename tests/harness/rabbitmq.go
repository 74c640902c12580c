package harness

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// rabbitStartTimeout bounds one node's boot until its MQTT listener
// accepts connections. A node boots in 15-25 s on a loaded two-core
// machine; a restarted node also waits for its peers' tables.
const rabbitStartTimeout = 120 * time.Second

// rabbitServer is the start script of Debian's rabbitmq-server package.
// /usr/sbin/rabbitmq-server would switch to the rabbitmq user and log to
// /var/log; this one runs as the caller with the environment we give it.
const rabbitServer = "/usr/lib/rabbitmq/bin/rabbitmq-server"

// RabbitCluster is a RabbitMQ cluster on 127.0.0.1, run from Debian's
// rabbitmq-server package (3.10) with the MQTT plugin, for tests that kill
// and restart nodes. Every node has its own name, ports and data
// directory; all share one Erlang cookie and a private epmd on a free
// port, so the cluster never meets another test's nodes or a system
// RabbitMQ. Durable MQTT sessions live in quorum queues
// (mqtt.durable_queue_type = quorum), replicated on every node.
type RabbitCluster struct {
	t        testing.TB
	dir      string
	epmd     *child
	epmdPort int
	nodes    []*RabbitNode
}

// RabbitNode is one node of a RabbitCluster.
type RabbitNode struct {
	c        *RabbitCluster
	name     string // rmqN@localhost
	mqttPort int
	dir      string
	logPath  string
	env      []string

	mu      sync.Mutex
	proc    *child
	runs    int
	runFrom int64
}

// StartRabbitCluster starts an n-node cluster and returns once every
// node's MQTT listener accepts connections. The first node boots alone and
// the others join it (peer discovery by a fixed node list), so the cluster
// is whole before any client declares a queue. Every node is SIGKILLed at
// cleanup, and the tail of each log is logged if the test failed.
func StartRabbitCluster(t testing.TB, n int) *RabbitCluster {
	t.Helper()
	if _, err := os.Stat(rabbitServer); err != nil {
		t.Fatalf("harness: %s not found; install RabbitMQ: apt-get install -y rabbitmq-server (the tests start their own nodes, never the service)", rabbitServer)
	}
	epmdExe := "/usr/bin/epmd"
	if _, err := os.Stat(epmdExe); err != nil {
		t.Fatalf("harness: %s not found; it comes with erlang-base (a dependency of rabbitmq-server)", epmdExe)
	}
	dir, err := os.MkdirTemp("", "harness-rabbitmq-")
	if err != nil {
		t.Fatalf("harness: rabbitmq temp dir: %v", err)
	}
	c := &RabbitCluster{t: t, dir: dir, epmdPort: FreePort(t)}
	t.Cleanup(func() { os.RemoveAll(dir) })

	home := filepath.Join(dir, "home")
	if err := os.MkdirAll(home, 0o700); err != nil {
		t.Fatalf("harness: %v", err)
	}
	// Erlang refuses a cookie file others can read.
	if err := os.WriteFile(filepath.Join(home, ".erlang.cookie"), []byte("harness-"+randomHex(16)), 0o400); err != nil {
		t.Fatalf("harness: write erlang cookie: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "enabled_plugins"), []byte("[rabbitmq_mqtt].\n"), 0o644); err != nil {
		t.Fatalf("harness: write enabled_plugins: %v", err)
	}

	type ports struct{ amqp, dist, mqtt int }
	ps := make([]ports, n)
	var peers strings.Builder
	for i := range n {
		ps[i] = ports{FreePort(t), FreePort(t), FreePort(t)}
		fmt.Fprintf(&peers, "cluster_formation.classic_config.nodes.%d = rmq%d@localhost\n", i+1, i+1)
	}
	for i := range n {
		nd := &RabbitNode{c: c, name: fmt.Sprintf("rmq%d@localhost", i+1), mqttPort: ps[i].mqtt,
			dir: filepath.Join(dir, fmt.Sprintf("rmq%d", i+1))}
		nd.logPath = filepath.Join(nd.dir, "node.log")
		if err := os.MkdirAll(nd.dir, 0o755); err != nil {
			t.Fatalf("harness: %v", err)
		}
		conf := fmt.Sprintf(`listeners.tcp.1 = 127.0.0.1:%d
mqtt.listeners.tcp.1 = 127.0.0.1:%d
mqtt.durable_queue_type = quorum
mqtt.allow_anonymous = true
loopback_users = none
cluster_formation.peer_discovery_backend = classic_config
%s`, ps[i].amqp, ps[i].mqtt, peers.String())
		if err := os.WriteFile(filepath.Join(nd.dir, "rabbitmq.conf"), []byte(conf), 0o644); err != nil {
			t.Fatalf("harness: write rabbitmq.conf: %v", err)
		}
		nd.env = append(os.Environ(),
			"HOME="+home,
			"ERL_EPMD_ADDRESS=127.0.0.1",
			"ERL_EPMD_PORT="+strconv.Itoa(c.epmdPort),
			"RABBITMQ_NODENAME="+nd.name,
			"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
			"RABBITMQ_NODE_PORT="+strconv.Itoa(ps[i].amqp),
			"RABBITMQ_DIST_PORT="+strconv.Itoa(ps[i].dist),
			"RABBITMQ_MNESIA_BASE="+filepath.Join(nd.dir, "mnesia"),
			"RABBITMQ_LOG_BASE="+filepath.Join(nd.dir, "log"),
			"RABBITMQ_CONFIG_FILE="+filepath.Join(nd.dir, "rabbitmq.conf"),
			"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(dir, "enabled_plugins"),
			"RABBITMQ_PID_FILE="+filepath.Join(nd.dir, "pid"),
			"RABBITMQ_CONF_ENV_FILE=/dev/null",
			"RABBITMQ_LOGS=-", // to stdout, i.e. node.log
			// Exec the VM in place of the script, so the pid we SIGKILL
			// is the node's; -noinput because stdin is /dev/null.
			"RABBITMQ_ALLOW_INPUT=1",
			"RABBITMQ_SERVER_START_ARGS=-noinput",
		)
		c.nodes = append(c.nodes, nd)
	}

	t.Cleanup(func() {
		for _, nd := range c.nodes {
			if t.Failed() {
				t.Logf("rabbitmq node %s (mqtt port %d), last log lines:\n%s", nd.name, nd.mqttPort, nd.LogTail(30))
			}
			nd.Kill()
		}
		if c.epmd != nil {
			_ = c.epmd.kill()
		}
	})
	// A private epmd: the nodes find each other through it, and it dies
	// with the test (an epmd the VM started itself would be a daemon).
	c.epmd, err = startChild(epmdExe, []string{"-port", strconv.Itoa(c.epmdPort), "-address", "127.0.0.1"},
		os.Environ(), dir, filepath.Join(dir, "epmd.log"), "")
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	if !Poll(10*time.Second, func() bool { return dialable(net.JoinHostPort("127.0.0.1", strconv.Itoa(c.epmdPort))) }) {
		t.Fatalf("harness: epmd on port %d not listening after 10s", c.epmdPort)
	}

	c.nodes[0].Start()
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := 1; i < n; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = c.nodes[i].start() }()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatalf("harness: %v", err)
		}
	}
	return c
}

// Nodes returns the cluster's nodes in name order (rmq1, rmq2, ...).
func (c *RabbitCluster) Nodes() []*RabbitNode { return c.nodes }

// URLs returns every node's MQTT URL, starting with node first and then in
// ring order: each client can be given a different preferred node.
func (c *RabbitCluster) URLs(first int) []string {
	out := make([]string, 0, len(c.nodes))
	for i := range c.nodes {
		out = append(out, c.nodes[(first+i)%len(c.nodes)].URL())
	}
	return out
}

// NodeByMQTTPort returns the node whose MQTT listener is on port, or nil.
func (c *RabbitCluster) NodeByMQTTPort(port int) *RabbitNode {
	for _, nd := range c.nodes {
		if nd.mqttPort == port {
			return nd
		}
	}
	return nil
}

// Name is the Erlang node name, e.g. rmq1@localhost.
func (nd *RabbitNode) Name() string { return nd.name }

// URL is the node's MQTT listener as a broker URL.
func (nd *RabbitNode) URL() string { return "tcp://" + nd.Addr() }

// Addr is host:port of the node's MQTT listener.
func (nd *RabbitNode) Addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(nd.mqttPort))
}

func (nd *RabbitNode) current() (*child, int64) {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	return nd.proc, nd.runFrom
}

// Running reports whether the node's VM is alive.
func (nd *RabbitNode) Running() bool {
	proc, _ := nd.current()
	return proc != nil && proc.running()
}

// Start boots the node (again, on the same ports and data directory) and
// waits until it logged "Server startup complete" and its MQTT listener
// accepts connections. It fails the test otherwise.
func (nd *RabbitNode) Start() {
	nd.c.t.Helper()
	if err := nd.start(); err != nil {
		nd.c.t.Fatalf("harness: %v", err)
	}
}

// start is Start without failing the test, for starting nodes in parallel.
func (nd *RabbitNode) start() error {
	if nd.Running() {
		return fmt.Errorf("rabbitmq node %s is already running", nd.name)
	}
	nd.mu.Lock()
	nd.runs++
	var runFrom int64
	if fi, err := os.Stat(nd.logPath); err == nil {
		runFrom = fi.Size()
	}
	proc, err := startChild(rabbitServer, nil, nd.env, nd.dir, nd.logPath,
		fmt.Sprintf("=== harness: %s start #%d ===", nd.name, nd.runs))
	if err == nil {
		nd.proc, nd.runFrom = proc, runFrom
	}
	nd.mu.Unlock()
	if err != nil {
		return err
	}
	ready := Poll(rabbitStartTimeout, func() bool {
		return !proc.running() || (strings.Contains(nd.runLog(), "Server startup complete") && dialable(nd.Addr()))
	})
	if !proc.running() {
		return fmt.Errorf("rabbitmq node %s exited with code %d during start; log:\n%s", nd.name, proc.exitCode(), nd.LogTail(30))
	}
	if !ready {
		return fmt.Errorf("rabbitmq node %s not accepting MQTT connections on port %d after %s; log:\n%s",
			nd.name, nd.mqttPort, rabbitStartTimeout, nd.LogTail(30))
	}
	return nil
}

// Kill SIGKILLs the node, as a crash would, and waits until it is gone.
func (nd *RabbitNode) Kill() {
	nd.c.t.Helper()
	proc, _ := nd.current()
	if proc == nil {
		return
	}
	if err := proc.kill(); err != nil {
		nd.c.t.Fatalf("harness: kill rabbitmq node %s: %v", nd.name, err)
	}
}

func (nd *RabbitNode) runLog() string {
	_, from := nd.current()
	return logFrom(nd.logPath, from)
}

// LogTail returns the last n lines of the node's log (all runs).
func (nd *RabbitNode) LogTail(n int) string { return tail(nd.logPath, n) }

// dialable reports whether addr accepts a TCP connection now.
func dialable(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}
