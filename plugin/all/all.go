// Package all registers every reliable-mqtt plugin (and the prometheus
// metrics exporter and the open_telemetry_collector tracer) with Benthos.
// Import it for its side effects.
package all

import (
	_ "github.com/reliable-mqtt/reliable-mqtt/plugin/ledger"
	_ "github.com/reliable-mqtt/reliable-mqtt/plugin/mqttin"
	_ "github.com/reliable-mqtt/reliable-mqtt/plugin/mqttout"
	_ "github.com/reliable-mqtt/reliable-mqtt/plugin/otelcollector"
	_ "github.com/reliable-mqtt/reliable-mqtt/plugin/prommetrics"
	_ "github.com/reliable-mqtt/reliable-mqtt/plugin/sqlquery"
)
