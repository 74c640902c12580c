package harness

import "fmt"

// Drain is a pipeline that publishes what an existing outbox holds and
// writes nothing new: its input never produces. Tests of damaged, newer or
// older files start it on a file they shaped.
type Drain struct {
	URL, Topic, Outbox string
	// Service holds top-level sections (http, metrics) as YAML lines.
	Service string
	// OutboxFields and OutputFields add keys: to the outbox's flow map
	// (", verify_on_start: auto") and to reliable_mqtt_out (YAML lines
	// indented by four spaces).
	OutboxFields, OutputFields string
}

// YAML is the pipeline's config.
func (d Drain) YAML() string {
	return fmt.Sprintf(`%s
logger: { level: INFO }
input:
  generate:
    interval: 1h
    mapping: 'root = deleted()'
output:
  reliable_mqtt_out:
    urls: [ %q ]
    topic: %s
    outbox: { path: %q%s }
    stats_interval: 200ms
%s`, d.Service, d.URL, d.Topic, d.Outbox, d.OutboxFields, d.OutputFields)
}
