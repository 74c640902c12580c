package mqttclient

import (
	"context"
	"errors"
	"math"
	"time"
)

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
// IDs pass the broker's in-flight ones. But each attempt is a round trip,
// and a session whose store holds hundreds of deliveries (the embedded
// broker after a power cut: tests/powerloss path E) would outlast
// connect_timeout, and the next connection numbers from 1 again: a
// livelock. So after inUseAttempts, or once the attempts have used a
// quarter of the time ctx leaves (connect_timeout: under a loaded or
// emulated machine 32 round trips can take longer), the connection goes on
// with a warning:
// the refusal can only come to a resumed session, which keeps the filters
// it had, and the broker frees the IDs as this client acknowledges the
// deliveries that hold them, so a later connection's SUBSCRIBE gets
// through (a filter new to the session waits until then).

// reasonPacketIDInUse is the SUBACK code 0x91.
const reasonPacketIDInUse byte = 0x91

// inUseAttempts is how many SUBSCRIBEs one connection sends before it goes
// on with the session's filters as they are.
const inUseAttempts = 32

// subscribeRetryingInUse runs once (one SUBSCRIBE and its SUBACK) until it
// does not fail with SUBACK 0x91, at most inUseAttempts times and within a
// quarter of ctx's time, and logs the first refusal and how it ended.
func subscribeRetryingInUse(ctx context.Context, log Logger, names []string, once func() error) error {
	start := time.Now()
	budget := time.Duration(math.MaxInt64)
	if deadline, ok := ctx.Deadline(); ok {
		budget = time.Until(deadline) / 4
	}
	for attempt := 1; ; attempt++ {
		err := once()
		var rc *ReasonCodeError
		if !errors.As(err, &rc) || rc.Code != reasonPacketIDInUse {
			if err == nil && attempt > 1 {
				log.Infof("MQTT SUBSCRIBE to %v accepted on attempt %d", names, attempt)
			}
			return err
		}
		if attempt == 1 {
			log.Infof("MQTT broker refused the SUBSCRIBE to %v with SUBACK 0x91 (packet identifier in use: the broker counts its own in-flight publishes to this session); subscribing again under the next packet ID", names)
		}
		if attempt == inUseAttempts || time.Since(start) > budget {
			log.Warnf("MQTT broker refused the SUBSCRIBE to %v %d times with SUBACK 0x91 (its in-flight publishes to this session hold those packet IDs); going on with the subscriptions the resumed session already has: a filter new to the session gets nothing until a later connection subscribes it", names, attempt)
			return nil
		}
	}
}
