package mqttclient

import "errors"

// startV5 starts an MQTT 5 transport on eclipse/paho.golang.
// TODO(v5): the implementation lands with the protocol_version field.
func startV5(Config, Handlers, Options) (Transport, error) {
	return nil, errors.New("mqtt: protocol version 5 is not implemented yet")
}
