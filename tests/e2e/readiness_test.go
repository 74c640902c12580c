package e2e

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// The bounds docs/operations.md promises: a dead broker shows within 15 s
// (in /ready and the connected gauges), a returned one within 30 s.
const (
	noticeLoss   = 15 * time.Second
	noticeReturn = 30 * time.Second
)

// readyStatus is GET /ready's status code and body; 0 when it did not answer.
func readyStatus(addr string) (int, string) {
	client := http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get("http://" + addr + "/ready")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// gauge reads one gauge from addr's /metrics; ok is false when it is absent.
func gauge(addr, name string) (float64, bool) {
	fams, err := harness.ScrapeMetrics("http://" + addr + "/metrics")
	if err != nil {
		return 0, false
	}
	return harness.MetricSum(fams, name, nil)
}

// expectState waits up to within for /ready to answer code and every gauge
// in gauges to read its value, and fails the test naming what it saw.
func expectState(t *testing.T, addr string, within time.Duration, what string, code int, gauges map[string]float64) {
	t.Helper()
	var lastCode int
	var lastBody string
	seen := map[string]string{}
	ok := slowPoll(within, func() bool {
		lastCode, lastBody = readyStatus(addr)
		all := lastCode == code
		for name, want := range gauges {
			v, present := gauge(addr, name)
			seen[name] = fmt.Sprintf("%v (present %v)", v, present)
			all = all && present && v == want
		}
		return all
	})
	if !ok {
		t.Fatalf("%s: within %s /ready should answer %d with gauges %v; last /ready %d %s, gauges %v",
			what, within, code, gauges, lastCode, strings.TrimSpace(lastBody), seen)
	}
}

func httpAddr(t *testing.T) string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(harness.FreePort(t)))
}

// A bridge (reliable_mqtt_in on one broker → direct reliable_mqtt_out on
// another) follows both links: killing either broker turns /ready 503 and
// its connected gauge 0, and its return turns them back, with no traffic
// needed for the input and the gauges; the direct output's /ready turns at
// its first write while its broker is away (Benthos learns an output's
// state from its writes), and that message is delivered after the return.
func TestReadinessFollowsBothBrokersOfABridge(t *testing.T) {
	edge := harness.StartMosquitto(t, harness.MosquittoOptions{DurableOnKill: true})
	cloud := harness.StartMosquitto(t, harness.MosquittoOptions{DurableOnKill: true})
	sub := harness.Subscribe(t, cloud.URL(), "readiness-sink", false, "out/#")
	addr := httpAddr(t)
	yaml := withPrometheus(t, fmt.Sprintf(`
http:
  enabled: false
input:
  reliable_mqtt_in:
    urls: [ %q ]
    client_id: readiness-bridge
    topics: [ "in/#" ]
output:
  reliable_mqtt_out:
    urls: [ %q ]
    topic: out/x
    outbox:
      enabled: false
`, edge.URL(), cloud.URL()), addr)
	harness.RunPipeline(t, yaml, harness.ProcOptions{})
	up := map[string]float64{"reliable_mqtt_in_connected": 1, "reliable_mqtt_out_connected": 1}
	expectState(t, addr, 60*time.Second, "at start", 200, up)

	edge.Kill()
	expectState(t, addr, noticeLoss, "edge broker killed", 503, map[string]float64{"reliable_mqtt_in_connected": 0, "reliable_mqtt_out_connected": 1})
	edge.Start()
	expectState(t, addr, noticeReturn, "edge broker back", 200, up)

	cloud.Kill()
	// No traffic: the gauge shows the loss.
	expectState(t, addr, noticeLoss, "cloud broker killed, no traffic", 200, map[string]float64{"reliable_mqtt_in_connected": 1, "reliable_mqtt_out_connected": 0})
	// A message to forward: the direct output cannot, and says so.
	harness.Publish(t, edge.URL(), "in/a", harness.Payloads("held-while-cloud-is-down"))
	expectState(t, addr, noticeLoss, "cloud broker killed, a message to forward", 503, map[string]float64{"reliable_mqtt_out_connected": 0})
	cloud.Start()
	expectState(t, addr, noticeReturn, "cloud broker back", 200, up)
	if !sub.WaitCount(1, 30*time.Second) {
		t.Fatalf("the message published while the cloud broker was down never arrived")
	}
}

// An output with an outbox stores while its broker is away: it stays ready
// (/ready 200), and reliable_mqtt_out_connected reports the link.
func TestOutboxOutputStaysReadyAndReportsTheLink(t *testing.T) {
	broker := harness.StartMosquitto(t, harness.MosquittoOptions{DurableOnKill: true})
	addr := httpAddr(t)
	yaml := withPrometheus(t, fmt.Sprintf(`
http:
  enabled: false
input:
  generate:
    interval: 200ms
    mapping: 'root = {"n": counter()}'
output:
  reliable_mqtt_out:
    urls: [ %q ]
    topic: out/x
    outbox:
      path: ./outbox.db
`, broker.URL()), addr)
	harness.RunPipeline(t, yaml, harness.ProcOptions{})
	expectState(t, addr, 60*time.Second, "at start", 200, map[string]float64{"reliable_mqtt_out_connected": 1})
	broker.Kill()
	expectState(t, addr, noticeLoss, "broker killed", 200, map[string]float64{"reliable_mqtt_out_connected": 0})
	// Still storing: the backlog grows while /ready stays 200.
	if !slowPoll(noticeLoss, func() bool { v, _ := gauge(addr, "reliable_mqtt_out_pending"); return v >= 5 }) {
		t.Fatalf("the outbox did not store while the broker was away")
	}
	if code, body := readyStatus(addr); code != 200 {
		t.Fatalf("an outbox output that stores should stay ready; /ready %d %s", code, body)
	}
	broker.Start()
	expectState(t, addr, noticeReturn, "broker back", 200, map[string]float64{"reliable_mqtt_out_connected": 1})
}
