package sender

import (
	"math"
	"time"
)

// The sizer sets how many records one session keeps unconfirmed, after the
// link it runs over. It follows TCP BBR's model, counted in records:
//
//   - Delivery rate. Every confirmation gives a rate sample: the records
//     confirmed since the flight was sent, over the longer of the time its
//     confirmations took and the time its sends took (BBR's guard against
//     confirmations that arrive in bursts). The bandwidth estimate is the
//     largest sample of the last bwRounds round trips, so it forgets a link
//     that got slower within those rounds.
//   - Round-trip time. The minimum RTT is the smallest confirmation latency
//     seen. A standing queue hides the true minimum, so when it has not
//     been seen again for probeEvery (plus probeEveryRTTs round trips) the
//     sizer probes: it holds the window at probeWindow records, which
//     empties any queue, until probeSamples records sent during the probe
//     are confirmed, and takes their smallest latency as the new minimum.
//   - Window. bdp = bandwidth × minimum RTT, the records the link holds.
//     The window moves toward cwndGain × bdp: it grows by one record per
//     confirmation (at most doubling per round trip), so while confirmed
//     throughput grows with the window it keeps growing; once the link is
//     full the rate stops growing, the RTT inflates instead, and the window
//     stops at most at twice the link's capacity. When the target falls (a
//     slower link), the window falls to it at once.
//   - Queueing. Confirmations that arrive in bursts (a broker answering a
//     batch of PUBLISHes at once) can overstate the rate, so the window
//     also grows only while the smoothed RTT stays below gain × the
//     minimum RTT (TCP Vegas's test; the gain is 2 but during and after a
//     kept gain trial, below): once the records it adds only wait
//     in a queue, it holds. On loopback the floor already keeps a queue (the
//     broker's CPU is the bottleneck), so the window stays at the floor.
//   - First round. Until a record sent after the first confirmation is
//     confirmed, every sample comes from one burst sent together, and one
//     stall of a loaded machine (a late first PUBACK batch on loopback)
//     looks like a long, fast link: minimum RTT and rate both high. The
//     window grows from the second round on, once a record has met the
//     link alone; on a real long link that costs one round trip.
//   - A deeper queue. On some paths the rate itself rises with the queue
//     (a broker or proxy that reads all it has queued at once pays its
//     per-read cost once for more records), so twice the bandwidth-delay
//     product leaves throughput unused that a client flooding the path
//     would get. Once the window has reached its target, the sizer tries a
//     gain gainStep times higher for gainTrialRounds round trips and keeps
//     it only if the confirmed rate of the last of them is gainRise above
//     the rate of the round before the trial; otherwise it returns to the
//     gain it had and waits gainRestRounds before the next trial. On a
//     link of fixed bandwidth the rate does not rise, so the queue stays
//     at about one round trip; the queue grows only while it buys
//     throughput, up to maxGain bandwidth-delay products.
//   - Packed sessions. A frame carries up to pack.max_events records in
//     one publish, and the server's Receive Maximum counts publishes, so a
//     floor of initialWindow records would be one frame: stop-and-wait on
//     loopback, and several round trips of doubling before a long link
//     carries what an unpacked session carries from its first round. A
//     packed session's floor (and start) is therefore full frames in as
//     many publishes as the Receive Maximum allows, at most
//     packFloorFrames (floorWindow).
//   - Records the application did not supply are not the link's limit: a
//     sample taken while the window ran dry (app-limited, as BBR names it)
//     can raise the estimate but never lower it.
//
// Bounds: the window is never above max (the user's `window`) and, but for
// the round trip of a probe, never below floor = min(initialWindow, max)
// (packed: see above), which is also where a session starts. On loopback
// the bandwidth-delay product is a handful of records, so a loopback
// session stays at the floor, which is the fixed window this replaced:
// loopback latency is unchanged by design. With max 1 the window
// is 1: strict stop-and-wait. Loss (a timeout, a lost connection) ends the
// session; the next one starts a new sizer at the floor (a packed one at
// initialWindow records if the session before it confirmed nothing).
//
// The sizer reads no clock: every call passes the time, so it is tested
// against a simulated link (sizer_test.go).
type sizer struct {
	max, floor int
	cwnd       int

	// Delivery-rate sampling (BBR's delivered, delivered_time and
	// first_sent_time).
	delivered       int64
	deliveredAt     time.Time
	firstSentAt     time.Time
	appLimitedUntil int64 // delivered count that ends an app-limited stretch; 0: none

	// Rounds: a round ends when a record sent after it began is confirmed.
	round     int64
	nextRound int64
	bw        [bwRounds]float64 // largest rate sample per round, records/s

	minRTT   time.Duration
	minRTTAt time.Time
	srtt     time.Duration // smoothed RTT (1/8 per sample, as TCP's)

	// Gain trials (see "A deeper queue").
	gain       float64 // cwndGain, or higher while a deeper queue raised the rate
	gainTrial  bool
	gainFrom   float64   // the gain before the trial
	gainBase   float64   // confirmed rate of the round before the trial, records/s
	gainRound  int64     // the round the trial began, or the first one the next may begin in
	roundRate  float64   // confirmed rate of the last round, records/s
	flatRounds int       // rounds in a row whose rate stayed within gainRise of the one before
	roundAt    time.Time // when the current round began
	roundFrom  int64     // delivered when the current round began

	probing      bool
	probeStart   time.Time
	probeMin     time.Duration
	probeSamples int
}

const (
	// initialWindow is where a session starts and the window's floor: the
	// fixed window of earlier versions, measured best on loopback.
	initialWindow = 64
	cwndGain      = 2
	// Gain trials: a step up, how long it is tried, the rise in rate that
	// keeps it, the rest after a failed one and the most gain.
	gainStep        = 1.2
	gainTrialRounds = 3
	gainRise        = 1.1
	gainRestRounds  = 10
	maxGain         = 6
	bwRounds        = 10
	// A probe costs about one round trip of an idle link, so it comes
	// every probeEvery plus probeEveryRTTs round trips.
	probeEvery     = 10 * time.Second
	probeEveryRTTs = 50
	probeSamples   = probeWindow
	// probeWindow is the window while probing: small enough to empty the
	// queue the floor itself keeps on a short link (BBR's ProbeRTT uses 4
	// packets). A larger one (a bandwidth-delay product) can leave a queue
	// after the link slowed, and a minimum RTT taken behind a queue grows
	// the window, the queue and the next minimum without end.
	probeWindow = 4
)

// sendMark is the sizer's state when a record was sent; its confirmation
// turns it into a rate sample.
type sendMark struct {
	delivered   int64
	deliveredAt time.Time
	firstSentAt time.Time
	appLimited  bool
}

// newSizer returns a sizer bounded by max whose floor, and start, is floor
// records (at most max).
func newSizer(max, floor int, now time.Time) *sizer {
	floor = min(floor, max)
	return &sizer{max: max, floor: floor, cwnd: floor, deliveredAt: now, firstSentAt: now, minRTTAt: now, gain: cwndGain, roundAt: now}
}

// packFloorFrames bounds the publishes of a packed session's floor:
// mosquitto's default Receive Maximum. At ~9 KB for an uncompressed frame
// of 64 readings that is under 200 KB, which even a 1 Mbit/s link carries
// well within publish_timeout's default of 5 s.
const packFloorFrames = 20

// floorWindow is a session's floor in records: initialWindow, or, packing
// maxEvents records per frame, as many full frames as the server's
// Receive Maximum rm allows, at most packFloorFrames (and never below
// initialWindow).
func floorWindow(maxEvents, rm int) int {
	return max(initialWindow, min(rm, packFloorFrames)*maxEvents)
}

// limit is how many records may be unconfirmed now.
func (s *sizer) limit() int {
	if s.probing {
		return min(probeWindow, s.max)
	}
	return s.cwnd
}

// bandwidth is the estimate in records per second.
func (s *sizer) bandwidth() float64 {
	var m float64
	for _, b := range s.bw {
		m = max(m, b)
	}
	return m
}

// target is gain × the bandwidth-delay product, within the bounds.
func (s *sizer) target() int {
	t := s.gain * s.bandwidth() * s.minRTT.Seconds()
	if t >= float64(s.max) {
		return s.max
	}
	return max(s.floor, int(math.Ceil(t)))
}

// sent marks a record as it is published.
func (s *sizer) sent() sendMark {
	return sendMark{delivered: s.delivered, deliveredAt: s.deliveredAt, firstSentAt: s.firstSentAt, appLimited: s.appLimitedUntil > 0}
}

// appLimited notes that the window ran out of records with inflight of its
// limit used: the samples of what is sent until those are confirmed say
// what the application supplied, not what the link carries.
func (s *sizer) appLimited(inflight int) {
	s.appLimitedUntil = max(s.delivered+int64(inflight), 1)
}

// confirmed takes the confirmation at now of a record sent at sentAt with
// mark; inflight is what is still unconfirmed after it.
func (s *sizer) confirmed(now, sentAt time.Time, mark sendMark, inflight int) {
	s.delivered++
	s.deliveredAt = now
	if s.appLimitedUntil > 0 && s.delivered > s.appLimitedUntil {
		s.appLimitedUntil = 0
	}
	rtt := max(now.Sub(sentAt), time.Nanosecond)
	if s.minRTT == 0 || rtt <= s.minRTT {
		s.minRTT, s.minRTTAt = rtt, now
	}
	s.probe(now, sentAt, rtt, inflight)

	if mark.delivered >= s.nextRound {
		s.round++
		s.nextRound = s.delivered
		s.bw[s.round%bwRounds] = 0
		if d := now.Sub(s.roundAt); d > 0 {
			rate := float64(s.delivered-s.roundFrom) / d.Seconds()
			// Flat: within gainRise of the round before, either way, and
			// not a probe of the minimum RTT (which empties the window).
			if !s.probing && rate < gainRise*s.roundRate && rate*gainRise > s.roundRate {
				s.flatRounds++
			} else {
				s.flatRounds = 0
			}
			s.roundRate = rate
		}
		s.roundAt, s.roundFrom = now, s.delivered
		s.tryGain()
	}
	interval := max(sentAt.Sub(mark.firstSentAt), now.Sub(mark.deliveredAt))
	s.firstSentAt = sentAt
	if interval > 0 && interval >= s.minRTT {
		rate := float64(s.delivered-mark.delivered) / interval.Seconds()
		if !mark.appLimited || rate >= s.bandwidth() {
			slot := &s.bw[s.round%bwRounds]
			*slot = max(*slot, rate)
		}
	}

	if s.srtt == 0 {
		s.srtt = rtt
	} else {
		s.srtt += (rtt - s.srtt) / 8
	}
	t := s.target()
	switch {
	case s.cwnd > t:
		s.cwnd = t
	case s.cwnd < t && s.round > 1 && float64(s.srtt) < s.gain*float64(s.minRTT):
		s.cwnd++
	}
}

// tryGain, at the start of a round, ends a gain trial (kept if the last
// round's rate rose by gainRise, else undone) or begins one when the window
// has reached its target above the floor with records to spare and the
// rate has stopped rising for two rounds (the window has filled the pipe at
// this gain: a trial begun while it still fills would credit the gain with
// what the window was about to reach anyway).
func (s *sizer) tryGain() {
	switch {
	case s.gainTrial:
		if s.round-s.gainRound < gainTrialRounds {
			return
		}
		s.gainTrial = false
		if s.roundRate < gainRise*s.gainBase {
			s.gain = s.gainFrom
			s.gainRound = s.round + gainRestRounds
		}
	case s.round >= s.gainRound && s.round > 2 && !s.probing && s.gain < maxGain &&
		s.cwnd > s.floor && s.cwnd >= s.target() && s.appLimitedUntil == 0 && s.flatRounds >= 2:
		s.gainTrial, s.gainFrom, s.gainBase, s.gainRound = true, s.gain, s.roundRate, s.round
		s.gain = min(s.gain*gainStep, maxGain)
	}
}

// probe starts a probe of the minimum RTT when it is stale, and ends one
// with the smallest latency of the records sent during it.
func (s *sizer) probe(now, sentAt time.Time, rtt time.Duration, inflight int) {
	if !s.probing {
		if now.Sub(s.minRTTAt) > probeEvery+probeEveryRTTs*s.minRTT {
			s.probing, s.probeStart, s.probeMin, s.probeSamples = true, now, 0, 0
		}
		return
	}
	if !sentAt.After(s.probeStart) {
		return
	}
	if s.probeMin == 0 || rtt < s.probeMin {
		s.probeMin = rtt
	}
	s.probeSamples++
	if s.probeSamples >= probeSamples || inflight == 0 {
		s.probing = false
		s.minRTT, s.minRTTAt = s.probeMin, now
	}
}

// DefaultWindow is the default upper bound of the window: enough records
// to fill a 600 ms satellite hop at over 6,000 records/s (cwndGain × BDP),
// and no memory beyond what the link holds, because the sizer grows the
// window only while confirmed throughput grows with it.
const DefaultWindow = 8192
