package bench

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	bolt "go.etcd.io/bbolt"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// BenchmarkFlash reports the bytes a block device was asked to write per
// reading (sectors written, from /sys/block/$FLASH_DEV/stat, after a sync)
// while one workload handles FLASH_N readings (default 1000) at FLASH_RATE
// a second (default 100), with every file it keeps under $FLASH_DIR, a filesystem on that
// device. tests/bench/flash.sh sets up a loop-mounted ext4 and runs it;
// without FLASH_DIR it is skipped. Every workload checks that every reading
// arrived. Brokers and subscribers outside the gateway keep their files off
// the device.
//
//	reference        130 bytes appended + fdatasync per reading, into a
//	                 preallocated (fallocate) file: the floor
//	outbox           generate → reliable_mqtt_out (confirm: broker) → mosquitto
//	outbox_delay10ms the same with outbox.commit_delay: 10ms
//	outbox_delay50ms the same with outbox.commit_delay: 50ms
//	ledger           mosquitto → reliable_mqtt_in → dedup_ledger (bbolt) → drop
//	store            a client publishing QoS 1 → embedded:// broker → a
//	                 persistent session (reliable_mqtt_in) → drop
//	chain            the quickstart's gateway: config/publisher.yaml and
//	                 config/bridge.yaml in one process (outbox + edge
//	                 embedded:// broker + bridge), the cloud broker and the
//	                 consumer's ACKs off the device; also reports the
//	                 outbox's and the edge store's own counters
//	                 (outboxB/reading, storeB/reading)
//	bbolt_*          bare bbolt, an append and a removal per commit, one
//	                 option changed at a time (flashBolt)
func BenchmarkFlash(b *testing.B) {
	dir, dev := os.Getenv("FLASH_DIR"), os.Getenv("FLASH_DEV")
	if dir == "" || dev == "" {
		b.Skip("FLASH_DIR and FLASH_DEV unset: run tests/bench/flash.sh")
	}
	n := 1000
	if v, err := strconv.Atoi(os.Getenv("FLASH_N")); err == nil && v > 0 {
		n = v
	}
	only := os.Getenv("FLASH_ONLY") // a comma-separated subset, for a quick look
	for _, w := range []struct {
		name string
		run  func(b *testing.B, dir string, n int)
	}{
		{"reference", flashReference},
		{"outbox", func(b *testing.B, dir string, n int) { flashOutbox(b, dir, n, "") }},
		{"outbox_delay10ms", func(b *testing.B, dir string, n int) { flashOutbox(b, dir, n, "10ms") }},
		{"outbox_delay50ms", func(b *testing.B, dir string, n int) { flashOutbox(b, dir, n, "50ms") }},
		{"ledger", flashLedger},
		{"store", flashStore},
		{"chain", flashChain},
		// bbolt alone, one append and the previous record's removal per
		// commit, with its options one at a time (what internal/boltfile
		// chose: no freelist sync, the default array freelist, 4 KiB pages).
		{"bbolt_freelist_sync", func(b *testing.B, dir string, n int) { flashBolt(b, dir, n, bolt.Options{}) }},
		{"bbolt_no_freelist_sync", func(b *testing.B, dir string, n int) { flashBolt(b, dir, n, bolt.Options{NoFreelistSync: true}) }},
		{"bbolt_hashmap_freelist", func(b *testing.B, dir string, n int) {
			flashBolt(b, dir, n, bolt.Options{NoFreelistSync: true, FreelistType: bolt.FreelistMapType})
		}},
		{"bbolt_page_1k", func(b *testing.B, dir string, n int) {
			flashBolt(b, dir, n, bolt.Options{NoFreelistSync: true, PageSize: 1024})
		}},
		{"bbolt_page_16k", func(b *testing.B, dir string, n int) {
			flashBolt(b, dir, n, bolt.Options{NoFreelistSync: true, PageSize: 16384})
		}},
		{"bbolt_mmap_1g", func(b *testing.B, dir string, n int) {
			flashBolt(b, dir, n, bolt.Options{NoFreelistSync: true, InitialMmapSize: 1 << 30})
		}},
	} {
		if only != "" && !strings.Contains(","+only+",", ","+w.name+",") {
			continue
		}
		b.Run(w.name, func(b *testing.B) {
			wd := filepath.Join(dir, w.name)
			if err := os.MkdirAll(wd, 0o755); err != nil {
				b.Fatal(err)
			}
			defer os.RemoveAll(wd)
			before := sectorsWritten(b, dev)
			w.run(b, wd, n)
			after := sectorsWritten(b, dev)
			b.ReportMetric(0, "ns/op")
			b.ReportMetric(float64(after-before)*512/float64(n), "devB/reading")
		})
	}
}

// sectorsWritten syncs every filesystem, then reads the device's count of
// 512-byte sectors written (the seventh field of its stat file), which
// includes the journal that /proc/PID/io does not see.
func sectorsWritten(b *testing.B, dev string) uint64 {
	syscall.Sync()
	raw, err := os.ReadFile(filepath.Join("/sys/block", dev, "stat"))
	if err != nil {
		b.Fatal(err)
	}
	f := strings.Fields(string(raw))
	if len(f) < 7 {
		b.Fatalf("/sys/block/%s/stat: %q", dev, raw)
	}
	v, err := strconv.ParseUint(f[6], 10, 64)
	if err != nil {
		b.Fatal(err)
	}
	return v
}

// flashInterval is the time between readings: 1 s / FLASH_RATE (default
// 100 readings a second).
func flashInterval() time.Duration {
	if v, err := strconv.Atoi(os.Getenv("FLASH_RATE")); err == nil && v > 0 {
		return time.Second / time.Duration(v)
	}
	return 10 * time.Millisecond
}

// paced calls f(i) for i in 0..n-1, one every flashInterval on a ticker,
// so a slow call does not shift the ones after it.
func paced(n int, f func(i int) error) error {
	t := time.NewTicker(flashInterval())
	defer t.Stop()
	for i := range n {
		if err := f(i); err != nil {
			return err
		}
		<-t.C
	}
	return nil
}

func flashReference(b *testing.B, dir string, n int) {
	const rec = 130
	f, err := os.OpenFile(filepath.Join(dir, "reference"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Fallocate(int(f.Fd()), 0, 0, int64(n*rec)); err != nil {
		b.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		b.Fatal(err)
	}
	buf := bytes.Repeat([]byte("r"), rec)
	err = paced(n, func(i int) error {
		if _, err := f.WriteAt(buf, int64(i*rec)); err != nil {
			return err
		}
		return syscall.Fdatasync(int(f.Fd()))
	})
	if err != nil {
		b.Fatal(err)
	}
}

// flashPublisher: generate → reliable_mqtt_out with confirm: broker and
// its defaults (64 writes in flight), a reading of ~120 bytes every
// flashInterval.
const flashPublisher = `
http:
  address: 127.0.0.1:%[1]d
metrics:
  prometheus: {}
input:
  generate:
    interval: %[7]s
    mapping: |
      let seq = counter()
      root = if $seq > %[2]d { deleted() } else { {"seq": $seq, "machine": "press-1", "temperature": 21.5, "pad": "%[5]s"} }
output:
  reliable_mqtt_out:
    urls: [ "%[3]s" ]
    topic: flash/readings
    outbox:
      path: %[4]s/outbox.db%[6]s
`

func flashOutbox(b *testing.B, dir string, n int, delay string) {
	m := broker(b)
	sub := harness.Subscribe(b, m.URL(), "flash-sub", true, "flash/readings")
	port := harness.FreePort(b)
	extra := "" // the default, as a user leaves it
	if delay != "" {
		extra = "\n      commit_delay: " + delay
	}
	p := harness.RunPipeline(b, fmt.Sprintf(flashPublisher, port, n, m.URL(), dir, strings.Repeat("x", 50), extra, flashInterval()), harness.ProcOptions{})
	url := fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
	if !waitCounter(url, "reliable_mqtt_out_confirmed", n, 5*time.Minute, func() {}) {
		b.Fatalf("%d readings not confirmed within 5 minutes:\n%s", n, p.Log())
	}
	if !sub.WaitCount(n, time.Minute) {
		b.Fatalf("the subscriber got %d of %d readings", sub.Count(), n)
	}
	if got := distinctSeqs(sub.Messages()); got != n {
		b.Fatalf("the subscriber got %d distinct readings of %d", got, n)
	}
	// What the output's own counter says bbolt wrote, once the last
	// removals are committed (held up to 1 s) and the gauges refreshed.
	time.Sleep(2500 * time.Millisecond)
	if fams, err := harness.ScrapeMetrics(url); err == nil {
		v, _ := harness.MetricSum(fams, "reliable_mqtt_out_outbox_written_bytes", nil)
		b.ReportMetric(v/float64(n), "counterB/reading")
	}
	stopFlash(b, p)
}

// distinctSeqs counts the distinct "seq" fields among JSON payloads.
func distinctSeqs(msgs []harness.Received) int {
	seen := map[string]bool{}
	for _, m := range msgs {
		if i := bytes.Index(m.Payload, []byte(`"seq":`)); i >= 0 {
			rest := m.Payload[i+6:]
			if j := bytes.IndexAny(rest, ",}"); j > 0 {
				seen[string(rest[:j])] = true
			}
		}
	}
	return len(seen)
}

// stopFlash stops a gateway process gracefully (what it commits at close
// counts too).
func stopFlash(b *testing.B, p *harness.Proc) {
	if err := p.Stop(30 * time.Second); err != nil {
		b.Fatalf("stopping %s: %v", p, err)
	}
}

// flashLedger: a persistent session into a bbolt dedup_ledger (keys
// committed when the pipeline acknowledges), then drop.
const flashLedgerConfig = `
http:
  address: 127.0.0.1:%[1]d
metrics:
  prometheus: {}
input:
  reliable_mqtt_in:
    urls: [ "%[2]s" ]
    client_id: flash-ledger
    topics: [ flash/ledger ]
    qos: 1
pipeline:
  processors:
    - dedup_ledger:
        path: %[3]s/ledger.db
        key: ${! json("seq") }
output:
  drop: {}
`

func flashLedger(b *testing.B, dir string, n int) {
	m := broker(b)
	port := harness.FreePort(b)
	flashSession(b, fmt.Sprintf(flashLedgerConfig, port, m.URL(), dir), port, m.URL(), "flash/ledger", "dedup_ledger_commits", n)
}

// flashSession runs a pipeline whose metrics are on port, publishes n
// readings to topic at url once its session is subscribed, waits until
// counter has moved by n, and stops it.
func flashSession(b *testing.B, yaml string, port int, url, topic, counter string, n int) {
	p := harness.RunPipeline(b, yaml, harness.ProcOptions{})
	metricsURL := fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
	if !waitMetric(metricsURL, 30*time.Second) {
		b.Fatalf("the pipeline did not start:\n%s", p.Log())
	}
	c0 := warmUp(b, url, topic, metricsURL, counter)
	publishPaced(b, url, topic, n, 1)
	if !waitCounter(metricsURL, counter, c0+n, 5*time.Minute, func() {}) {
		b.Fatalf("%s did not move by %d within 5 minutes:\n%s", counter, n, p.Log())
	}
	stopFlash(b, p)
}

// flashStoreConfig: a persistent session on the embedded broker, whose
// store is under the device; the readings come from a client of its
// listener.
const flashStoreConfig = `
http:
  address: 127.0.0.1:%[1]d
metrics:
  prometheus: {}
input:
  reliable_mqtt_in:
    urls: [ "embedded://?dir=%[2]s/edge&listen=%[3]s" ]
    client_id: flash-store
    topics: [ flash/store ]
    qos: 1
output:
  drop: {}
`

func flashStore(b *testing.B, dir string, n int) {
	listen := fmt.Sprintf("127.0.0.1:%d", harness.FreePort(b))
	port := harness.FreePort(b)
	flashSession(b, fmt.Sprintf(flashStoreConfig, port, dir, listen), port, "tcp://"+listen, "flash/store", "reliable_mqtt_in_received", n)
}

// waitMetric waits until url serves metrics.
func waitMetric(url string, timeout time.Duration) bool {
	return harness.Poll(timeout, func() bool {
		_, err := harness.ScrapeMetrics(url)
		if err != nil {
			time.Sleep(100 * time.Millisecond)
		}
		return err == nil
	})
}

// warmUp publishes a reading with seq 0 every 200 ms until the counter
// at metricsURL moves (the pipeline's session is subscribed), and returns
// the counter's value then.
func warmUp(b *testing.B, url, topic, metricsURL, counter string) int {
	var v float64
	ok := harness.Poll(time.Minute, func() bool {
		c := mqtt.NewClient(mqtt.NewClientOptions().AddBroker(url).SetClientID("flash-warm"))
		if tok := c.Connect(); tok.WaitTimeout(5*time.Second) && tok.Error() == nil {
			c.Publish(topic, 1, false, `{"seq":0}`).WaitTimeout(5 * time.Second)
			c.Disconnect(100)
		}
		time.Sleep(200 * time.Millisecond)
		if fams, err := harness.ScrapeMetrics(metricsURL); err == nil {
			v, _ = harness.MetricSum(fams, counter, nil)
		}
		return v > 0
	})
	if !ok {
		b.Fatalf("%s did not move within a minute of publishing to %s", counter, topic)
	}
	time.Sleep(time.Second) // let the last warm-up copies settle
	if fams, err := harness.ScrapeMetrics(metricsURL); err == nil {
		v, _ = harness.MetricSum(fams, counter, nil)
	}
	return int(v)
}

// publishPaced publishes n JSON readings with a "seq" at QoS qos, 100 a
// second, on one connection, each waiting for its PUBACK.
func publishPaced(b *testing.B, url, topic string, n int, qos byte) {
	c := mqtt.NewClient(mqtt.NewClientOptions().AddBroker(url).SetClientID("flash-pub").SetCleanSession(true))
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		b.Fatalf("connect %s: %v", url, tok.Error())
	}
	defer c.Disconnect(250)
	pad := strings.Repeat("x", 50)
	err := paced(n, func(i int) error {
		tok := c.Publish(topic, qos, false, fmt.Sprintf(`{"seq":%d,"machine":"press-1","temperature":21.5,"pad":"%s"}`, i+1, pad))
		if !tok.WaitTimeout(30 * time.Second) {
			return fmt.Errorf("reading %d: no PUBACK within 30 s", i+1)
		}
		return tok.Error()
	})
	if err != nil {
		b.Fatal(err)
	}
}

// flashChain runs the quickstart's publisher and bridge in one process as
// a gateway does: the publisher's outbox and the edge broker's store on
// the device, the bridge forwarding to a cloud broker off it, where a
// consumer ACKs each reading end to end.
func flashChain(b *testing.B, dir string, n int) {
	cloud := broker(b)
	acker := harness.StartAcker(b, cloud.URL(), "reliable/deliveries", "reliable/consumer-acks", nil)
	root := harness.ModuleRoot(b)
	// The quickstart's root config, with the metrics served so that the
	// outbox's and the edge store's own counters say whose bytes they are.
	port := harness.FreePort(b)
	rootYAML := filepath.Join(b.TempDir(), "root.yaml")
	if err := os.WriteFile(rootYAML, fmt.Appendf(nil, flashChainRoot, port), 0o600); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(harness.Binary(b), "streams", "--no-api", "-o", rootYAML,
		filepath.Join(root, "config", "publisher.yaml"),
		filepath.Join(root, "config", "bridge.yaml"))
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PUBLISH_INTERVAL="+flashInterval().String(), fmt.Sprintf("PUBLISH_COUNT=%d", n),
		"DATA_DIR="+dir, "EDGE_BROKER=embedded://?dir="+dir+"/edge", "SOURCE_BROKER=embedded://?dir="+dir+"/edge",
		"DEST_BROKER="+cloud.URL(), "STATS_INTERVAL=1s")
	logs := &harness.LogBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	defer func() {
		select {
		case <-done:
		default:
			_ = cmd.Process.Kill()
			<-done
		}
	}()
	distinct := func() int {
		seen := map[string]bool{}
		for _, in := range acker.Seen() {
			seen[in.EventID] = true
		}
		return len(seen)
	}
	if !harness.Poll(5*time.Minute, func() bool { time.Sleep(100 * time.Millisecond); return distinct() >= n }) {
		b.Fatalf("the consumer got %d of %d readings:\n%s", distinct(), n, harness.TailLines(logs.String(), 40))
	}
	// The publisher's outbox empties once the last ACKs are back.
	if !harness.Poll(time.Minute, func() bool {
		time.Sleep(200 * time.Millisecond)
		return strings.Contains(lastLine(logs.String(), "publisher-outbox.db"), "; 0 pending")
	}) {
		b.Fatalf("the publisher's outbox did not empty:\n%s", harness.TailLines(logs.String(), 40))
	}
	// The last removals commit within 1 s, and the counters follow.
	time.Sleep(2500 * time.Millisecond)
	if fams, err := harness.ScrapeMetrics(fmt.Sprintf("http://127.0.0.1:%d/metrics", port)); err == nil {
		for metric, unit := range map[string]string{
			"reliable_mqtt_out_outbox_written_bytes":     "outboxB/reading",
			"reliable_mqtt_embedded_store_written_bytes": "storeB/reading",
		} {
			v, _ := harness.MetricSum(fams, metric, nil)
			b.ReportMetric(v/float64(n), unit)
		}
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		b.Fatalf("the gateway did not stop within 30 s of SIGTERM")
	}
	if got := distinct(); got != n {
		b.Fatalf("the consumer got %d distinct readings, not %d", got, n)
	}
}

// flashChainRoot is resources/quickstart-root.yaml with the metrics served
// on a port of the benchmark's.
const flashChainRoot = `
http:
  address: 127.0.0.1:%d
metrics:
  prometheus: {}
logger:
  level: INFO
  format: logfmt
`

// flashBolt commits, one every flashInterval, a 130-byte record and the
// removal of the one before it (what the outbox commits per reading when
// each confirmation rides with the next append), on a bare bbolt file
// opened with o.
func flashBolt(b *testing.B, dir string, n int, o bolt.Options) {
	db, err := bolt.Open(filepath.Join(dir, "bare.db"), 0o600, &o)
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	bucket, val := []byte("records"), bytes.Repeat([]byte("r"), 130)
	if err := db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucketIfNotExists(bucket); return err }); err != nil {
		b.Fatal(err)
	}
	key := func(i int) []byte { return []byte(fmt.Sprintf("%016d", i)) }
	err = paced(n, func(i int) error {
		return db.Update(func(tx *bolt.Tx) error {
			rb := tx.Bucket(bucket)
			rb.FillPercent = 1
			if i > 0 {
				if err := rb.Delete(key(i - 1)); err != nil {
					return err
				}
			}
			return rb.Put(key(i), val)
		})
	})
	if err != nil {
		b.Fatal(err)
	}
}

// lastLine returns the last line of s that contains substr.
func lastLine(s, substr string) string {
	lines := strings.Split(s, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], substr) {
			return lines[i]
		}
	}
	return ""
}
