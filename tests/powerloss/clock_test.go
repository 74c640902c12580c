package powerloss

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The clock scenario (issue 32): gateways boot at 1970 and NTP steps them
// to today later. The guest has a clock of its own, set with date -s; the
// disk keeps the ledger files from boot to boot. Two bbolt dedup_ledger
// files, retention 3m (the expirer runs every 45 s), the same 50 events
// each time, a line printed for each event that passes:
//
//	boot 1  1970-01-02: 50 events on s.db and on w.db: 50 pass each.
//	boot 2  w.db: the clock starts at 1970-01-02 and is stepped to today
//	        15 s into a run of the 50 events, one a second; then s.db, the
//	        clock stepped between runs: the 50 events, one a second. None
//	        may pass: each key has been held for about a minute of observed
//	        time, far from 3m, whatever the wall clock says.
//	boot 3  today: each file held open 180 s (two other keys go through).
//	boot 4  the 50 events again on each file: every key is now past
//	        retention of observed time (≥ 50 s in boot 2, 180 s in boot 3),
//	        so all 50 pass: expiry still happens.

// clockEvents is a pipeline over the ledger file: count events with IDs
// "<prefix>-0-<n>" (every interval; "" as fast as they go), printing the
// ID of each one that passes.
func clockEvents(prefix, file, interval string, count int) string {
	return fmt.Sprintf(`
http: {enabled: false}
logger: {level: WARN}
input:
  generate:
    interval: "%s"
    count: %d
    mapping: |
      let id = "%s-0-" + counter().string()
      root = $id
      meta event_id = $id
pipeline:
  processors:
    - dedup_ledger: { path: /data/%s, commit: immediate, retention: 3m }
    - mapping: 'root = content().string() + "\n"'
output:
  stdout: { codec: all-bytes }
`, interval, count, prefix, file)
}

// clockScenario is the guest's init fragment: one branch per boot; today
// is the host's time when the test started.
func clockScenario(today time.Time) string {
	now := today.UTC().Format("2006-01-02 15:04:05")
	run := func(cfg string) string { return "reliable-mqtt -c /cfg/" + cfg + ".yaml >/dev/ttyS1 2>/dev/console" }
	return fmt.Sprintf(`case "$CYCLE" in
1)
  date -s "1970-01-02 00:00:00"
  %[2]s
  %[3]s
  ;;
2)
  date -s "1970-01-02 00:10:00"
  %[4]s &
  sleep 15
  date -s "%[1]s"
  echo "clock: stepped during the run to $(date)"
  wait
  %[5]s
  ;;
3)
  date -s "%[1]s"
  %[6]s &
  %[7]s &
  wait
  ;;
4)
  date -s "%[1]s"
  %[2]s
  %[3]s
  ;;
esac
`, now, run("s-fast"), run("w-fast"), run("w-slow"), run("s-slow"), run("s-idle"), run("w-idle"))
}

// clockGuest builds the initramfs of the clock scenario.
func clockGuest(t *testing.T) guest {
	t.Helper()
	kernel, modules, busybox := debs(t)
	bin := staticBinary(t, "")
	files := map[string][]byte{"init": initScript(clockScenario(time.Now()))}
	for name, c := range map[string]string{
		"s-fast": clockEvents("S", "s.db", "", 50),
		"w-fast": clockEvents("W", "w.db", "", 50),
		"s-slow": clockEvents("S", "s.db", "1s", 50),
		"w-slow": clockEvents("W", "w.db", "1s", 50),
		// Two events 180 s apart: the file is held open that long.
		"s-idle": clockEvents("I", "s.db", "180s", 2),
		"w-idle": clockEvents("I", "w.db", "180s", 2),
	} {
		files["cfg/"+name+".yaml"] = []byte(c)
	}
	initrd := filepath.Join(t.TempDir(), "initrd.cpio")
	initramfs(t, initrd, busybox, modules, bin, files)
	return guest{kernel: kernel, initrd: initrd}
}

func TestClockStepsNeverExpireKeysEarly(t *testing.T) {
	g := clockGuest(t)
	img := filepath.Join(t.TempDir(), "disk.img")
	disk(t, img, 64)
	passed := func(n int, want map[string]int) {
		t.Helper()
		// The scenario powers the guest off when it ends; the cut is only
		// boot's bound (6 minutes in all).
		c := boot(t, g, img, n, "", time.Hour, nil)
		if c.Killed || !strings.Contains(c.Serial, "powerloss: scenario ended") {
			t.Fatalf("boot %d: the scenario did not end (killed %v):\n%s", n, c.Killed, tail(c.Serial))
		}
		for p, w := range want {
			if got := len(c.Acks[p]); got != w {
				t.Errorf("boot %d: %d events of %s passed, want %d: %v\n%s", n, got, p, w, c.Acks[p], tail(c.Serial))
			}
		}
		t.Logf("boot %d: passed %v, booted in %s", n, map[string]int{"S": len(c.Acks["S"]), "W": len(c.Acks["W"])}, c.BootTook.Round(time.Second))
	}
	passed(1, map[string]int{"S": 50, "W": 50})
	if t.Failed() {
		t.FailNow()
	}
	passed(2, map[string]int{"S": 0, "W": 0}) // none applied twice
	passed(3, map[string]int{"S": 0, "W": 0, "I": 4})
	passed(4, map[string]int{"S": 50, "W": 50}) // expired: they pass again
}

// The embedded broker under a clock step: its sessions and queued
// messages expire by the time the broker observed, not by the wall clock
// (internal/embedded/expiry.go). One boot, one process holding the broker:
//
//	x-broker  generate, one "X-0-<n>" every 500 ms -> reliable_mqtt_out
//	          (MQTT 5, message_expiry 1h) to the embedded broker it runs
//	          (listening on 127.0.0.1:1885), then stdout.
//	x-sub     reliable_mqtt_in (MQTT 5, session_expiry_interval 1h,
//	          tcp://127.0.0.1:1885) -> stdout "R:X-0-<n>" and /tmp/sub.
//
// At 1970-01-02 the subscriber runs until its first message, stops (its
// session offline, messages queued for it), and 15 s later the clock is
// stepped to today, 56 years on. 10 s later (ten ticks of the broker's
// expiry loop) the subscriber starts again and runs 60 s. Every message
// from its first to its last must have arrived: the session and the
// messages queued in it were held for about 25 s of observed time, far
// from their hour.
func brokerClockScenario(today time.Time) string {
	return fmt.Sprintf(`date -s "1970-01-02 00:00:00"
reliable-mqtt -c /cfg/x-broker.yaml >/dev/ttyS1 2>/dev/console &
B=$!
reliable-mqtt -c /cfg/x-sub.yaml >/dev/ttyS1 2>/dev/console &
S=$!
i=0
until grep -q "^R:X-" /tmp/sub 2>/dev/null || [ $i -ge 300 ]; do sleep 1; i=$((i+1)); done
kill $S; wait $S
echo "clock: subscriber stopped after $i s"
sleep 15
date -s "%s"
echo "clock: stepped to $(date)"
sleep 10
reliable-mqtt -c /cfg/x-sub.yaml >/dev/ttyS1 2>/dev/console &
S=$!
sleep 60
kill $B $S
wait
`, today.UTC().Format("2006-01-02 15:04:05"))
}

const brokerClockPub = `
http: {enabled: false}
logger: {level: WARN}
input:
  generate:
    interval: 500ms
    mapping: 'root = "X-0-" + counter().string()'
output:
  broker:
    pattern: fan_out_sequential
    outputs:
      - reliable_mqtt_out:
          urls: [ "embedded://?dir=/data/xbroker&listen=127.0.0.1:1885" ]
          protocol_version: "5"
          topic: clock/q
          event_id: '${! content() }'
          message_expiry: 1h
          outbox: { path: /data/x-outbox.db }
      - stdout: { codec: all-bytes }
        processors: [ { mapping: 'root = content().string() + "\n"' } ]
`

const brokerClockSub = `
http: {enabled: false}
logger: {level: WARN}
input:
  reliable_mqtt_in:
    urls: [ "tcp://127.0.0.1:1885" ]
    protocol_version: "5"
    session_expiry_interval: 1h
    client_id: clock-sub
    topics: [ clock/q ]
    qos: 1
pipeline:
  processors:
    - mapping: 'root = "R:" + content().string() + "\n"'
output:
  broker:
    pattern: fan_out
    outputs:
      - stdout: { codec: all-bytes }
      - file: { path: /tmp/sub, codec: all-bytes }
`

func TestClockStepsNeverExpireBrokerSessionsEarly(t *testing.T) {
	kernel, modules, busybox := debs(t)
	files := map[string][]byte{
		"init":              initScript(brokerClockScenario(time.Now())),
		"cfg/x-broker.yaml": []byte(brokerClockPub),
		"cfg/x-sub.yaml":    []byte(brokerClockSub),
	}
	initrd := filepath.Join(t.TempDir(), "initrd.cpio")
	initramfs(t, initrd, busybox, modules, staticBinary(t, ""), files)
	img := filepath.Join(t.TempDir(), "disk.img")
	disk(t, img, 64)
	c := boot(t, guest{kernel: kernel, initrd: initrd}, img, 1, "", time.Hour, nil)
	if c.Killed || !strings.Contains(c.Serial, "powerloss: scenario ended") || !strings.Contains(c.Serial, "clock: stepped") {
		t.Fatalf("the scenario did not end (killed %v):\n%s", c.Killed, tail(c.Serial))
	}
	for _, l := range strings.Split(c.Serial, "\n") {
		if strings.HasPrefix(l, "clock: ") {
			t.Log(strings.TrimSpace(l))
		}
	}
	published, got := serials(t, c.Acks["X"]), serials(t, c.Acks["R:X"])
	if len(got) == 0 {
		t.Fatalf("the subscriber received nothing:\n%s", tail(c.Serial))
	}
	first, last := slices.Min(got), slices.Max(got)
	var lost []int
	for n := first; n <= last; n++ {
		if !slices.Contains(got, n) {
			lost = append(lost, n)
		}
	}
	t.Logf("published %d, received %d to %d (%d lines), booted in %s", len(published), first, last, len(got), c.BootTook.Round(time.Second))
	if len(lost) > 0 {
		t.Errorf("%d of the messages from %d to %d were lost across the clock step: %v", len(lost), first, last, lost)
	}
	// The subscriber's last run (60 s) reached what was published 25 s
	// before it started and more: at 2 a second, the queue held some 50.
	if pub := slices.Max(published); last < pub-20 || last-first < 60 {
		t.Errorf("received %d to %d of the %d published: the subscriber's last run did not get past the queue", first, last, pub)
	}
}

// serials are the numbers n of IDs "X-0-<n>".
func serials(t *testing.T, ids []string) []int {
	t.Helper()
	var out []int
	for _, id := range ids {
		n, err := strconv.Atoi(id[strings.LastIndex(id, "-")+1:])
		if err != nil {
			t.Fatalf("ID %q: %v", id, err)
		}
		out = append(out, n)
	}
	return out
}
