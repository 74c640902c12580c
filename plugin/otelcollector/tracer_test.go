package otelcollector

import (
	"strings"
	"testing"

	_ "github.com/redpanda-data/benthos/v4/public/components/pure"
	"github.com/redpanda-data/benthos/v4/public/service"
)

func build(tracer string) error {
	sb := service.NewStreamBuilder()
	if err := sb.SetTracerYAML(tracer); err != nil {
		return err
	}
	if err := sb.AddInputYAML(`generate: { count: 1, mapping: 'root = "x"' }`); err != nil {
		return err
	}
	if err := sb.AddOutputYAML(`drop: {}`); err != nil {
		return err
	}
	_, err := sb.Build()
	return err
}

func TestAConnectTracerSectionBuilds(t *testing.T) {
	for _, conf := range []string{
		`open_telemetry_collector: { service: a, http: [ { address: "127.0.0.1:4318" } ] }`,
		`open_telemetry_collector: { service: a, grpc: [ { address: "127.0.0.1:4317", secure: true } ], tags: { site: x } }`,
		`open_telemetry_collector: { service: a, http: [], grpc: [], sampling: { enabled: true, ratio: 0.01 } }`,
	} {
		if err := build(conf); err != nil {
			t.Errorf("%s: %v", conf, err)
		}
	}
}

func TestABadSamplingOrAddressStopsTheStart(t *testing.T) {
	for conf, want := range map[string]string{
		`open_telemetry_collector: { sampling: { enabled: true } }`:                         "sampling.ratio is not set",
		`open_telemetry_collector: { sampling: { enabled: true, ratio: 2 } }`:               "not a share between 0 and 1",
		`open_telemetry_collector: { http: [ { address: "" } ] }`:                           "needs an address",
		`open_telemetry_collector: { grpc: [ { address: "" } ], sampling: { ratio: 0.5 } }`: "needs an address",
	} {
		err := build(conf)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v, want an error saying %q", conf, err, want)
		}
	}
}
