package embedded

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/mochi-mqtt/server/v2/hooks/storage"
	"github.com/mochi-mqtt/server/v2/packets"
	"go.etcd.io/bbolt"
)

const waitFor = 15 * time.Second

func TestParseURL(t *testing.T) {
	ok := []struct {
		url  string
		want Config
	}{
		{"embedded://", Config{Dir: DefaultDir, MaxInflight: 65535, MaxQueued: 100000}},
		{"embedded:///", Config{Dir: DefaultDir, MaxInflight: 65535, MaxQueued: 100000}},
		{"embedded://?dir=/var/lib/b&listen=127.0.0.1:1883", Config{Dir: "/var/lib/b", Listen: "127.0.0.1:1883", MaxInflight: 65535, MaxQueued: 100000}},
		{"embedded://?dir=./d&max_inflight=10&max_queued=20", Config{Dir: "./d", MaxInflight: 10, MaxQueued: 20}},
	}
	for _, c := range ok {
		got, err := ParseURL(c.url)
		if err != nil {
			t.Errorf("ParseURL(%q): %v", c.url, err)
			continue
		}
		if got != c.want {
			t.Errorf("ParseURL(%q) = %+v, want %+v", c.url, got, c.want)
		}
	}

	bad := map[string]string{
		"embedded://localhost":           "only query parameters",
		"embedded://?dir=a/b#x":          "only query parameters",
		"embedded:///some/path":          "only query parameters",
		"embedded://?path=/x":            `unknown parameter "path"`,
		"embedded://?dir=":               "dir is empty",
		"embedded://?listen=":            "listen is empty",
		"embedded://?dir=a&dir=b":        "given 2 times",
		"embedded://?max_inflight=0":     "max_inflight",
		"embedded://?max_inflight=70000": "max_inflight",
		"embedded://?max_queued=-1":      "max_queued",
		"tcp://127.0.0.1:1883":           "scheme must be",
		// A listener other hosts can reach needs credentials.
		"embedded://?listen=0.0.0.0:1883":            "add users=FILE",
		"embedded://?listen=:1883":                   "add users=FILE",
		"embedded://?listen=192.0.2.1:1883":          "add users=FILE",
		"embedded://?users=/u":                       "add listen=HOST:PORT",
		"embedded://?listen=127.0.0.1:1&acl=/a":      "acl needs users",
		"embedded://?listen=127.0.0.1:1&tls_cert=/c": "tls_cert and tls_key together",
	}
	for u, want := range bad {
		_, err := ParseURL(u)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseURL(%q) error = %v, want it to mention %q", u, err, want)
		}
	}

	if !IsEmbedded("embedded://?dir=x") || IsEmbedded("tcp://127.0.0.1:1883") || IsEmbedded("::bad") {
		t.Error("IsEmbedded classifies URLs wrongly")
	}
}

func TestAcquireSharesOneBrokerPerDirAndLastReleaseCloses(t *testing.T) {
	dir := t.TempDir()
	u := "embedded://?dir=" + url.QueryEscape(dir)

	a, err := Acquire(u)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Acquire(u)
	if err != nil {
		t.Fatal(err)
	}
	if a.ClientURL() != b.ClientURL() || a.Dir() != b.Dir() {
		t.Fatalf("same dir gave two brokers: %s and %s", a.ClientURL(), b.ClientURL())
	}
	if a.Dir() != dir {
		t.Errorf("Dir() = %s, want %s", a.Dir(), dir)
	}
	if _, err := os.Stat(filepath.Join(dir, "broker.db")); err != nil {
		t.Errorf("store file missing: %v", err)
	}

	other, err := Acquire("embedded://?dir=" + url.QueryEscape(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	if other.ClientURL() == a.ClientURL() {
		t.Error("different dirs share a broker")
	}
	if err := other.Release(); err != nil {
		t.Fatal(err)
	}

	if _, err := Acquire(u + "&max_inflight=5"); err == nil || !strings.Contains(err.Error(), "same limits") {
		t.Errorf("conflicting limits accepted: %v", err)
	}

	addr := strings.TrimPrefix(a.ClientURL(), "tcp://")
	if err := a.Release(); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(); err != nil { // a second Release of one handle is a no-op
		t.Fatal(err)
	}
	c := connect(t, b.ClientURL(), "still-up", true, nil)
	c.Disconnect(100)

	if err := b.Release(); err != nil {
		t.Fatal(err)
	}
	if conn, err := net.DialTimeout("tcp", addr, 2*time.Second); err == nil {
		conn.Close()
		t.Fatalf("broker port %s still open after the last Release", addr)
	}
	// The store is closed too: the file can be opened again at once.
	again, err := Acquire(u)
	if err != nil {
		t.Fatalf("reacquire after close: %v", err)
	}
	_ = again.Release()
}

func TestListenListenerIsReachableByOtherClients(t *testing.T) {
	addr := freeAddr(t)
	b, err := Acquire("embedded://?dir=" + url.QueryEscape(t.TempDir()) + "&listen=" + addr)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release()

	got := newCollector()
	sub := connect(t, "tcp://"+addr, "outside", true, got.handler)
	defer sub.Disconnect(100)
	subscribe(t, sub, "x/y", 1)

	pub := connect(t, b.ClientURL(), "inside", true, nil)
	defer pub.Disconnect(100)
	publish(t, pub, "x/y", 1, false, "hello")
	got.waitCount(t, 1)

	// A later URL on the same dir may add a listener to the running broker.
	addr2 := freeAddr(t)
	b2, err := Acquire("embedded://?dir=" + url.QueryEscape(b.Dir()) + "&listen=" + addr2)
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Release()
	c := connect(t, "tcp://"+addr2, "outside-2", true, nil)
	c.Disconnect(100)
}

func TestGracefulRestartKeepsOfflineQueueAndRetained(t *testing.T) {
	for _, qos := range []byte{1, 2} {
		t.Run(fmt.Sprintf("qos%d", qos), func(t *testing.T) {
			dir := t.TempDir()
			u := "embedded://?dir=" + url.QueryEscape(dir)
			const n = 100
			topic := "q/orders"

			b, err := Acquire(u)
			if err != nil {
				t.Fatal(err)
			}
			sub := connect(t, b.ClientURL(), "persistent-sub", false, nil)
			subscribe(t, sub, topic, qos)
			sub.Disconnect(100)

			pub := connect(t, b.ClientURL(), "pub", true, nil)
			for i := range n {
				publish(t, pub, topic, qos, false, fmt.Sprintf("m-%03d", i))
			}
			publish(t, pub, "state/door", qos, true, "open")
			pub.Disconnect(100)

			b = restartBroker(t, b, u)
			defer func() { _ = b.Release() }()

			// No re-subscribe: the stored session alone must deliver.
			got := newCollector()
			sub, present := connectSession(t, b.ClientURL(), "persistent-sub", false, got.handler)
			if !present {
				t.Error("CONNACK session present = false after restart")
			}
			got.waitCount(t, n)
			got.assertExactly(t, topic, n)

			ret := newCollector()
			late := connect(t, b.ClientURL(), "late", true, ret.handler)
			subscribe(t, late, "state/#", 1)
			ret.waitCount(t, 1)
			if m := ret.first(); string(m.payload) != "open" || !m.retained {
				t.Errorf("retained message after restart = %q retained=%v, want \"open\" retained", m.payload, m.retained)
			}
			late.Disconnect(100)

			// Acknowledged messages are gone for good: after another restart
			// only a marker published now arrives, nothing from before.
			waitAcked(t, b, "persistent-sub")
			sub.Disconnect(100)
			b = restartBroker(t, b, u)
			again := newCollector()
			sub, _ = connectSession(t, b.ClientURL(), "persistent-sub", false, again.handler)
			defer sub.Disconnect(100)
			pub = connect(t, b.ClientURL(), "pub", true, nil)
			defer pub.Disconnect(100)
			publish(t, pub, topic, qos, false, "marker")
			again.waitCount(t, 1)
			if m := again.first(); string(m.payload) != "marker" {
				t.Errorf("after acks and a restart the session redelivered %q; want only the new marker", m.payload)
			}
		})
	}
}

// TestInterruptedFanoutIsReplayedOnStart covers a crash after a publisher's
// PUBACK but before mochi queued the message for subscribers: the fan-out
// record left in the file must reach the offline session on start.
func TestInterruptedFanoutIsReplayedOnStart(t *testing.T) {
	dir := t.TempDir()
	u := "embedded://?dir=" + url.QueryEscape(dir)
	b, err := Acquire(u)
	if err != nil {
		t.Fatal(err)
	}
	sub := connect(t, b.ClientURL(), "replay-sub", false, nil)
	subscribe(t, sub, "r/#", 1)
	sub.Disconnect(100)
	if err := b.Release(); err != nil {
		t.Fatal(err)
	}

	// Write the record a crashed broker would have left behind.
	db, err := bbolt.Open(filepath.Join(dir, storeFile), 0o600, &bbolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	rec, _ := storage.Message{
		TopicName:   "r/1",
		Payload:     []byte("interrupted"),
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1},
		Created:     time.Now().Unix(),
	}.MarshalBinary()
	err = db.Update(func(tx *bbolt.Tx) error { return tx.Bucket(bucketFanout).Put(seqKey(7), rec) })
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}

	b, err = Acquire(u)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release()
	got := newCollector()
	sub = connect(t, b.ClientURL(), "replay-sub", false, got.handler)
	defer sub.Disconnect(100)
	got.waitCount(t, 1)
	if m := got.first(); string(m.payload) != "interrupted" || m.topic != "r/1" {
		t.Errorf("replayed %q on %q, want \"interrupted\" on r/1", m.payload, m.topic)
	}
	var left int
	_ = b.inst.store.db.View(func(tx *bbolt.Tx) error { left = tx.Bucket(bucketFanout).Stats().KeyN; return nil })
	if left != 0 {
		t.Errorf("%d fan-out records left after replay, want 0", left)
	}
}

const helperEnv = "EMBEDDED_BROKER_HELPER_URL"

// TestHelperBrokerProcess is not a test: TestSIGKILL... runs the test binary
// again with this test selected to host a broker in a separate process.
func TestHelperBrokerProcess(t *testing.T) {
	u := os.Getenv(helperEnv)
	if u == "" {
		t.Skip("helper process for TestSIGKILLRestartKeepsOfflineQueue")
	}
	b, err := Acquire(u)
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(2)
	}
	fmt.Println("READY", b.ClientURL())
	// Live until killed; the parent never waits longer than this.
	time.Sleep(2 * time.Minute)
	os.Exit(3)
}

func TestSIGKILLRestartKeepsOfflineQueue(t *testing.T) {
	dir := t.TempDir()
	addr := freeAddr(t)
	u := "embedded://?dir=" + url.QueryEscape(dir) + "&listen=" + addr
	broker := "tcp://" + addr
	const n = 100

	child := startHelper(t, u)
	sub := connect(t, broker, "killed-sub", false, nil)
	subscribe(t, sub, "k/events", 1)
	sub.Disconnect(100)

	pub := connect(t, broker, "killed-pub", true, nil)
	for i := range n {
		publish(t, pub, "k/events", 1, false, fmt.Sprintf("m-%03d", i)) // waits for the PUBACK
	}
	publish(t, pub, "k/state", 1, true, "last")
	pub.Disconnect(100)

	// The child holds the store: this process must get a clear error, not a second broker.
	if _, err := Acquire("embedded://?dir=" + url.QueryEscape(dir)); err == nil || !strings.Contains(err.Error(), "locked") {
		t.Errorf("second process on the same dir: err = %v, want a 'locked' error", err)
	}

	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()

	startHelper(t, u)
	got := newCollector()
	sub, present := connectSession(t, broker, "killed-sub", false, got.handler)
	defer sub.Disconnect(100)
	if !present {
		t.Error("CONNACK session present = false after SIGKILL")
	}
	got.waitCount(t, n)
	got.assertExactly(t, "k/events", n)

	ret := newCollector()
	late := connect(t, broker, "killed-late", true, ret.handler)
	defer late.Disconnect(100)
	subscribe(t, late, "k/state", 1)
	ret.waitCount(t, 1)
	if m := ret.first(); string(m.payload) != "last" || !m.retained {
		t.Errorf("retained after SIGKILL = %q retained=%v, want \"last\" retained", m.payload, m.retained)
	}
}

// startHelper runs TestHelperBrokerProcess in a child process and waits for
// its broker to be ready. The child is killed when the test ends.
func startHelper(t *testing.T, brokerURL string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperBrokerProcess$")
	cmd.Env = append(os.Environ(), helperEnv+"="+brokerURL)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	ready := make(chan string, 1)
	go func() {
		s := bufio.NewScanner(out)
		for s.Scan() {
			line := s.Text()
			if strings.HasPrefix(line, "READY") || strings.HasPrefix(line, "ERROR") {
				ready <- line
				break
			}
		}
		_, _ = io.Copy(io.Discard, out) // keep the pipe drained
	}()
	select {
	case line := <-ready:
		if !strings.HasPrefix(line, "READY") {
			t.Fatalf("helper broker failed: %s", line)
		}
	case <-time.After(waitFor):
		t.Fatal("helper broker not ready in time")
	}
	return cmd
}

// restartBroker releases b, the only reference to its broker, and starts the
// broker again from its data directory.
func restartBroker(t *testing.T, b *Broker, u string) *Broker {
	t.Helper()
	if err := b.Release(); err != nil {
		t.Fatal(err)
	}
	b, err := Acquire(u)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// waitAcked waits until the broker holds no unacknowledged message for id.
func waitAcked(t *testing.T, b *Broker, id string) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		cl, ok := b.inst.server.Clients.Get(id)
		if !ok || cl.State.Inflight.Len() == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("client %s still has %d unacknowledged messages", id, cl.State.Inflight.Len())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// --- MQTT client helpers -------------------------------------------------

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func connect(t *testing.T, broker, id string, clean bool, h paho.MessageHandler) paho.Client {
	t.Helper()
	c, _ := connectSession(t, broker, id, clean, h)
	return c
}

// connectSession connects with the handler installed before CONNECT, so
// messages a resumed session sends at once are not dropped.
func connectSession(t *testing.T, broker, id string, clean bool, h paho.MessageHandler) (paho.Client, bool) {
	t.Helper()
	if h == nil {
		h = func(paho.Client, paho.Message) {}
	}
	opts := paho.NewClientOptions().
		AddBroker(broker).
		SetClientID(id).
		SetCleanSession(clean).
		SetAutoReconnect(false).
		SetConnectTimeout(5 * time.Second).
		SetKeepAlive(30 * time.Second).
		SetDefaultPublishHandler(h)
	c := paho.NewClient(opts)
	tok := c.Connect()
	if !tok.WaitTimeout(waitFor) {
		t.Fatalf("connect %s to %s: timeout", id, broker)
	}
	if err := tok.Error(); err != nil {
		t.Fatalf("connect %s to %s: %v", id, broker, err)
	}
	return c, tok.(*paho.ConnectToken).SessionPresent()
}

func subscribe(t *testing.T, c paho.Client, filter string, qos byte) {
	t.Helper()
	tok := c.Subscribe(filter, qos, nil)
	if !tok.WaitTimeout(waitFor) || tok.Error() != nil {
		t.Fatalf("subscribe %s: %v", filter, tok.Error())
	}
}

func publish(t *testing.T, c paho.Client, topic string, qos byte, retained bool, payload string) {
	t.Helper()
	tok := c.Publish(topic, qos, retained, payload)
	if !tok.WaitTimeout(waitFor) || tok.Error() != nil {
		t.Fatalf("publish %q to %s: not acknowledged: %v", payload, topic, tok.Error())
	}
}

type received struct {
	topic    string
	payload  []byte
	retained bool
}

type collector struct {
	mu   sync.Mutex
	msgs []received
	more chan struct{}
}

func newCollector() *collector { return &collector{more: make(chan struct{}, 1)} }

func (c *collector) handler(_ paho.Client, m paho.Message) {
	c.mu.Lock()
	c.msgs = append(c.msgs, received{topic: m.Topic(), payload: m.Payload(), retained: m.Retained()})
	c.mu.Unlock()
	select {
	case c.more <- struct{}{}:
	default:
	}
}

func (c *collector) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.msgs)
}

func (c *collector) first() received {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.msgs[0]
}

func (c *collector) waitCount(t *testing.T, n int) {
	t.Helper()
	deadline := time.After(waitFor)
	for c.count() < n {
		select {
		case <-c.more:
		case <-deadline:
			t.Fatalf("received %d messages, want %d", c.count(), n)
		}
	}
}

// assertExactly checks that m-000 .. m-(n-1) each arrived on topic, and
// nothing else.
func (c *collector) assertExactly(t *testing.T, topic string, n int) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	seen := map[string]int{}
	for _, m := range c.msgs {
		if m.topic != topic {
			t.Errorf("unexpected message on %s: %q", m.topic, m.payload)
			continue
		}
		seen[string(m.payload)]++
	}
	for i := range n {
		p := fmt.Sprintf("m-%03d", i)
		if seen[p] == 0 {
			t.Errorf("message %s lost", p)
		}
		delete(seen, p)
	}
	for p := range seen {
		t.Errorf("unexpected payload %q", p)
	}
}
