// Package all registers every reliable-mqtt plugin with Benthos. Import it
// for its side effects.
package all

import (
	_ "github.com/reliable-mqtt/reliable-mqtt/plugin/mqttout"
)
