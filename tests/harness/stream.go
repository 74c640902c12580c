package harness

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"
	"time"
)

// LedgerEvent is the seed's event: "add delta", keyed by producer/event_id.
func LedgerEvent(id string) []byte {
	return fmt.Appendf(nil, `{"producer":"sensor-demo","event_id":%q,"delta":1}`, id)
}

// DupStream is ev-1..ev-n in order, each one to three times: the copies of
// an event land up to ~40 events after it, so duplicates come both close
// together and far apart.
func DupStream(rng *rand.Rand, n int) []string {
	type slot struct {
		at int
		id string
	}
	var slots []slot
	for i := 1; i <= n; i++ {
		id := fmt.Sprintf("ev-%d", i)
		slots = append(slots, slot{i * 10, id})
		for range rng.IntN(3) {
			slots = append(slots, slot{i*10 + 1 + rng.IntN(400), id})
		}
	}
	sort.SliceStable(slots, func(a, b int) bool { return slots[a].at < slots[b].at })
	stream := make([]string, len(slots))
	for i, s := range slots {
		stream[i] = s.id
	}
	return stream
}

// PublishStream publishes LedgerEvent(id) for every id of stream to
// events/in at url, as PublishChunks does.
func PublishStream(t testing.TB, url string, stream []string, chunk int, pause time.Duration) <-chan struct{} {
	events := make([][]byte, len(stream))
	for i, id := range stream {
		events[i] = LedgerEvent(id)
	}
	return PublishChunks(t, url, "events/in", events, chunk, pause)
}

// PublishChunks publishes payloads to topic at url, chunk at a time with
// pause after each chunk, from a goroutine of its own; the returned channel
// is closed when it is done. A publish error is reported with t.Error
// (t.Fatal belongs to the test's goroutine) and ends the stream. The end of
// the test ends it too, and waits for it, so it never reports into a
// finished test.
func PublishChunks(t testing.TB, url, topic string, payloads [][]byte, chunk int, pause time.Duration) <-chan struct{} {
	done, stop := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for start := 0; start < len(payloads); start += chunk {
			part := payloads[start:min(start+chunk, len(payloads))]
			if err := PublishErr(url, topic, part); err != nil {
				t.Errorf("publish payloads %d..%d of the stream: %v", start+1, start+len(part), err)
				return
			}
			select {
			case <-stop:
				return
			case <-time.After(pause):
			}
		}
	}()
	t.Cleanup(func() {
		close(stop)
		<-done // bounded: each PublishErr is
	})
	return done
}
