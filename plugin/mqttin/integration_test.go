package mqttin

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service/integration"

	"github.com/reliable-mqtt/reliable-mqtt/internal/embedded"
	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"

	_ "github.com/reliable-mqtt/reliable-mqtt/plugin/mqttout"
)

// suiteTemplate connects reliable_mqtt_out (direct mode: Write returns at
// the broker's PUBACK) to reliable_mqtt_in through one topic per test.
// $URL is set per broker; $ID, $MAX_IN_FLIGHT are Benthos's own variables.
const suiteTemplate = `
output:
  reliable_mqtt_out:
    urls: [ "$URL" ]
    topic: it/$ID
    outbox:
      enabled: false
    max_in_flight: $MAX_IN_FLIGHT
input:
  reliable_mqtt_in:
    urls: [ "$URL" ]
    client_id: in-$ID
    topics: [ it/$ID ]
    qos: 1
    connect_timeout: 5s
    reconnect_backoff:
      initial_interval: 50ms
      max_interval: 1s
`

// deliverySuite is Benthos's own delivery-guarantee suite, including the
// two tests that restart the input. It is not gated by
// integration.CheckSkip: it runs on every `go test`.
func deliverySuite() integration.StreamTestList {
	return integration.StreamTests(
		integration.StreamTestOpenClose(),
		integration.StreamTestSendBatch(10),
		integration.StreamTestStreamParallel(200),
		integration.StreamTestAtLeastOnceDelivery(),
		integration.StreamTestStreamParallelLossyThroughReconnect(100),
	)
}

// presubscribe creates the input's persistent session before the suite
// publishes: the suite starts the output and the input together and sends
// at once, and a message published before the first SUBSCRIBE of a new
// session is rightly not delivered to it.
func presubscribe(url func() string) integration.StreamTestOptFunc {
	return integration.StreamTestOptPreTest(func(t testing.TB, _ context.Context, vars *integration.StreamTestConfigVars) {
		s := harness.Subscribe(t, url(), "in-"+vars.ID, false, "it/"+vars.ID)
		s.Close()
	})
}

// suiteWatchdog bounds a suite run. The suite's own waits last until the
// test binary's deadline (10 minutes by default), so a lost message would
// otherwise hang the package that long; this ends it with a clear message.
func suiteWatchdog(t *testing.T, limit time.Duration) {
	timer := time.AfterFunc(limit, func() {
		panic(fmt.Sprintf("%s: still running after %s: a message the suite waits for never arrived (see the test's comments)", t.Name(), limit))
	})
	t.Cleanup(func() { timer.Stop() }) // after the parallel subtests
}

func TestDeliverySuiteMosquitto(t *testing.T) {
	suiteWatchdog(t, 2*time.Minute)
	b := harness.StartMosquitto(t, harness.MosquittoOptions{MaxInflight: 100})
	deliverySuite().Run(t, suiteTemplate,
		integration.StreamTestOptVarSet("URL", b.URL()),
		integration.StreamTestOptTimeout(90*time.Second),
		presubscribe(b.URL),
	)
}

func TestDeliverySuiteEmbedded(t *testing.T) {
	suiteWatchdog(t, 2*time.Minute)
	url := "embedded://?dir=" + t.TempDir()
	// Hold a reference for the whole test, so that the broker (shared with
	// the components by its directory) outlives every input restart.
	broker, err := embedded.Acquire(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := broker.Release(); err != nil {
			t.Errorf("release embedded broker: %v", err)
		}
	})
	// The full suite, including the two tests that restart the input. They
	// used to be left out here because of two bugs of mochi v2.7.9 that the
	// embedded package now works around (internal/embedded/takeover.go and
	// order.go): messages published while a persistent session was resumed
	// were lost, and in-flight messages were resent in arbitrary order.
	deliverySuite().Run(t, suiteTemplate,
		integration.StreamTestOptVarSet("URL", url),
		integration.StreamTestOptTimeout(90*time.Second),
		presubscribe(broker.ClientURL),
	)
}
