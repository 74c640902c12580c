package embedded

import (
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// receiveMaxHook makes the broker send to an MQTT 5 client as it sends to
// a 3.1.1 client: without counting against the client's Receive Maximum.
//
// mochi v2.7.9 deadlocks a client's connection when it applies that limit:
// after each packet it handles it calls Inflight.NextImmediate, which read-
// locks the inflight map and then read-locks it again in GetAll; a publish
// to the same client waiting for the write lock in between blocks both for
// good (Go's RWMutex is not reentrant). mochi takes that path only while
// the send quota, set from the client's Receive Maximum, is above zero, so
// clearing it here, after mochi parsed CONNECT and before it inherits the
// session (which sets the quota again from the same property), keeps every
// client off it. The cost: a client that asked for at most N unacknowledged
// messages may get more; the MQTT 5 clients of reliable-mqtt queue them
// (their manual-ack consumer holds what arrives, bounded by the broker's
// max_inflight).
type receiveMaxHook struct{ mqtt.HookBase }

func (h *receiveMaxHook) ID() string { return "reliable-mqtt-receive-maximum" }

func (h *receiveMaxHook) Provides(b byte) bool { return b == mqtt.OnConnect }

func (h *receiveMaxHook) OnConnect(cl *mqtt.Client, _ packets.Packet) error {
	cl.Properties.Props.ReceiveMaximum = 0
	cl.State.Inflight.ResetSendQuota(0)
	return nil
}
