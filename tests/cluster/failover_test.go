// Package cluster runs reliable-mqtt against a three-node RabbitMQ 3.10
// cluster on loopback whose nodes are SIGKILLed and restarted under load.
package cluster

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// TestClusterNodeKillsLoseNothingEndToEndWhileBrokerConfirmTrustsTheCluster
// runs two chains side by side on one three-node RabbitMQ cluster (MQTT
// sessions in quorum queues): publisher → cluster → bridge (with outbox) →
// cluster → consumer (SQL counter + ledger in one transaction), one with
// `confirm: end_to_end` on every hop, one with `confirm: broker`.
//
// Both publishers start before their bridge has ever subscribed: a
// publish that no queue is bound to yet is PUBACKed by RabbitMQ and
// dropped. Then, four times, the node that a client of the end_to_end
// chain (publisher, bridge, consumer) or of the broker chain's bridge is
// connected to is SIGKILLed and later restarted; the clients fail over to
// the next URL of their list.
//
// Asserted, end_to_end: the counter is exactly n, every seq applied once,
// and both outboxes drain. broker: both outboxes drain too, yet the
// events published before the bridge's queue existed never arrive; the
// seqs that are missing are exactly those first ones (node kills lost
// nothing: a PUBACK from a quorum queue means a majority has it). Every
// connection of both consumers resumed its session. Before the chains
// start, checkProtocolLimits shows RabbitMQ 3.10's QoS and $share limits.
// docs/scaling.md reports what this test logs.
func TestClusterNodeKillsLoseNothingEndToEndWhileBrokerConfirmTrustsTheCluster(t *testing.T) {
	const n, kills = 600, 4
	began := time.Now()
	rc := harness.StartRabbitCluster(t, 3)
	t.Logf("three-node cluster ready in %s", time.Since(began).Round(time.Second))
	checkProtocolLimits(t, rc.Nodes()[0].URL())

	e2e := &chain{name: "end_to_end", n: n, dir: t.TempDir(), cluster: rc, pubNode: 0, inNode: 1, outNode: 2, conNode: 0}
	brk := &chain{name: "broker", n: n, dir: t.TempDir(), cluster: rc, pubNode: 1, inNode: 2, outNode: 0, conNode: 1}
	chains := []*chain{e2e, brk}
	for _, c := range chains {
		// The consumer's session exists before anything is forwarded to it.
		harness.Subscribe(t, rc.Nodes()[c.conNode].URL(), "cl-"+c.name+"-consumer", false, c.consumerTopic()).Close()
		c.consumer = harness.RunPipeline(t, c.consumerYAML(), harness.ProcOptions{})
	}
	for _, c := range chains {
		c.publisher = harness.RunPipeline(t, c.publisherYAML("140ms"), harness.ProcOptions{})
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, c := range chains {
				for _, p := range []*harness.Proc{c.publisher, c.bridge, c.consumer} {
					if p != nil {
						t.Logf("%s log tail:\n%s", p, tail(p.Log(), 25))
					}
				}
			}
		}
	})
	// The broker chain's publisher has had PUBACKs for publishes no queue
	// took: the bridge has not subscribed yet.
	harness.Eventually(t, 60*time.Second, "the broker publisher's first 20 PUBACKs", func() bool {
		return confirmed(brk.publisher.Log()) >= 20
	})
	for _, c := range chains {
		c.bridge = harness.RunPipeline(t, c.bridgeYAML(), harness.ProcOptions{})
	}

	victims := []struct {
		role string
		p    *harness.Proc
	}{{"end_to_end publisher", e2e.publisher}, {"end_to_end bridge", e2e.bridge}, {"end_to_end consumer", e2e.consumer}, {"broker bridge", brk.bridge}}
	for k := range kills {
		time.Sleep(3 * time.Second) // traffic flows through the whole cluster
		v := victims[k%len(victims)]
		var nd *harness.RabbitNode
		harness.Eventually(t, 30*time.Second, fmt.Sprintf("the %s connected to a node", v.role), func() bool {
			nd = nodeOf(t, rc, v.p)
			return nd != nil
		})
		counter, _ := e2e.applied(t)
		t.Logf("kill %d: SIGKILL %s, the node the %s is connected to (end_to_end counter %d/%d)", k+1, nd.Name(), v.role, counter, n)
		nd.Kill()
		time.Sleep(3 * time.Second) // the clients fail over and carry on
		restart := time.Now()
		nd.Start()
		t.Logf("kill %d: %s back in %s", k+1, nd.Name(), time.Since(restart).Round(time.Second))
	}

	harness.Eventually(t, 120*time.Second, fmt.Sprintf("end_to_end: all %d events applied", n), func() bool {
		c, _ := e2e.applied(t)
		return c >= n
	})
	for _, c := range chains {
		for _, ob := range []struct {
			p    *harness.Proc
			path string
		}{{c.publisher, c.pubOutbox()}, {c.bridge, c.bridgeOutbox()}} {
			harness.Eventually(t, 90*time.Second, fmt.Sprintf("%s: outbox %s to drain", c.name, ob.path), func() bool {
				return pendingNow(ob.p.RunLog(), ob.path) == 0
			})
		}
	}
	// Stragglers (redeliveries of the last kill) settle; then stop
	// gracefully and read the outbox files themselves.
	time.Sleep(2 * time.Second)
	for _, c := range chains {
		for _, p := range []*harness.Proc{c.publisher, c.bridge, c.consumer} {
			if err := p.Stop(15 * time.Second); err != nil {
				t.Error(err)
			}
		}
		for _, path := range []string{c.pubOutbox(), c.bridgeOutbox()} {
			if left := outboxPending(t, path); left != 0 {
				t.Errorf("%s: outbox %s holds %d records after the run", c.name, path, left)
			}
		}
	}

	// RabbitMQ reports a session present when its queue exists. The
	// consumers' sessions were created before they first ran, so every
	// connection, the ones after a failover included, must resume: the
	// quorum queue outlived the node. (Clients without a subscription,
	// like the broker chain's publisher, have no queue and always see
	// false.)
	for _, c := range chains {
		for role, p := range map[string]*harness.Proc{"publisher": c.publisher, "bridge": c.bridge, "consumer": c.consumer} {
			resumed, fresh := sessions(p.Log())
			t.Logf("%s %s: %d connections resumed a session, %d started a new one", c.name, role, resumed, fresh)
		}
		if resumed, fresh := sessions(c.consumer.Log()); fresh != 0 || (c.e2e() && resumed < 2) {
			t.Errorf("%s consumer: %d connections resumed its session, %d did not; want all resumed (and at least 2 with end_to_end, whose consumer's node was killed)", c.name, resumed, fresh)
		}
	}

	counter, seqs := e2e.applied(t)
	t.Logf("end_to_end: counter=%d, %d applied rows, %d kills, total %s", counter, len(seqs), kills, time.Since(began).Round(time.Second))
	if counter != n || len(seqs) != n || !exactlyOnce(seqs, 1, n) {
		t.Fatalf("end_to_end: counter %d, %d applied rows; want each of seqs 1..%d exactly once (missing %v)", counter, len(seqs), n, missing(seqs, n))
	}

	counter, seqs = brk.applied(t)
	lost := missing(seqs, n)
	t.Logf("broker: counter=%d, both outboxes empty, %d of %d events never delivered: seqs %s", counter, len(lost), n, ranges(lost))
	if counter != len(seqs) || !exactlyOnce(seqs, 1+len(lost), n) {
		t.Fatalf("broker: counter %d, applied rows %d, missing %v: want every seq after the first missing ones exactly once", counter, len(seqs), lost)
	}
	if len(lost) == 0 {
		t.Fatal("broker: nothing was lost, although the publisher was PUBACKed before any queue was bound: the test did not show what it claims")
	}
}

// sessions counts a process's connections that resumed a session and
// those that started a new one.
func sessions(log string) (resumed, fresh int) {
	return strings.Count(log, "session present: true)"), strings.Count(log, "session present: false)")
}

// exactlyOnce reports whether seqs (sorted) is from..to, each once.
func exactlyOnce(seqs []int, from, to int) bool {
	if len(seqs) != to-from+1 {
		return false
	}
	for i, s := range seqs {
		if s != from+i {
			return false
		}
	}
	return true
}

// missing lists the seqs of 1..n not in seqs.
func missing(seqs []int, n int) []int {
	have := map[int]bool{}
	for _, s := range seqs {
		have[s] = true
	}
	var out []int
	for s := 1; s <= n; s++ {
		if !have[s] {
			out = append(out, s)
		}
	}
	return out
}

// ranges prints sorted ints as "1-20, 33".
func ranges(xs []int) string {
	sort.Ints(xs)
	out := ""
	for i := 0; i < len(xs); {
		j := i
		for j+1 < len(xs) && xs[j+1] == xs[j]+1 {
			j++
		}
		if out != "" {
			out += ", "
		}
		if i == j {
			out += fmt.Sprint(xs[i])
		} else {
			out += fmt.Sprintf("%d-%d", xs[i], xs[j])
		}
		i = j + 1
	}
	if out == "" {
		return "none"
	}
	return out
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
