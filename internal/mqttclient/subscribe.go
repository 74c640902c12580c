package mqttclient

import "errors"

// SUBACK 0x91 (packet identifier in use), on either protocol.
//
// The embedded broker (mochi v2.7.9) keeps the packet IDs of its own
// in-flight publishes to a client in the same table as the client's, and
// refuses a SUBSCRIBE whose ID one of them holds with 0x91, although MQTT
// numbers each direction independently. A new connection numbers from 1,
// so a resumed session whose unacknowledged delivery holds ID 1 (an old
// one, or a new one routed to the inherited subscription before our
// SUBSCRIBE) is refused at every connection. mochi sends 0x91 to 3.1.1
// clients too, a code 3.1.1 does not define.
//
// The answer is the same SUBSCRIBE under the next packet ID: both paho
// clients take a fresh one for each packet, so the attempts end once the
// IDs pass the broker's in-flight ones. They are bounded by the caller's
// ctx (connect_timeout) and by the 65535 IDs there are.

// reasonPacketIDInUse is the SUBACK code 0x91.
const reasonPacketIDInUse byte = 0x91

// maxPacketIDs is how many packet IDs there are: after that many
// attempts every ID has been refused.
const maxPacketIDs = 65535

// subscribeRetryingInUse runs once (one SUBSCRIBE and its SUBACK) until
// it does not fail with SUBACK 0x91, and logs the first refusal and the
// attempt that was accepted.
func subscribeRetryingInUse(log Logger, names []string, once func() error) error {
	for attempt := 1; ; attempt++ {
		err := once()
		var rc *ReasonCodeError
		if !errors.As(err, &rc) || rc.Code != reasonPacketIDInUse || attempt == maxPacketIDs {
			if err == nil && attempt > 1 {
				log.Infof("MQTT SUBSCRIBE to %v accepted on attempt %d", names, attempt)
			}
			return err
		}
		if attempt == 1 {
			log.Infof("MQTT broker refused the SUBSCRIBE to %v with SUBACK 0x91 (packet identifier in use: the broker counts its own in-flight publishes to this session); subscribing again under the next packet ID", names)
		}
	}
}
