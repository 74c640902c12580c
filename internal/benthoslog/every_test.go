package benthoslog_test

import (
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/benthoslog"
)

func TestEveryLetsOneThroughPerInterval(t *testing.T) {
	e := benthoslog.Every{Interval: time.Hour}
	if !e.Allow() {
		t.Fatal("the first warning was held back")
	}
	for range 3 {
		if e.Allow() {
			t.Fatal("a second warning within the interval got through")
		}
	}
	short := benthoslog.Every{Interval: time.Nanosecond}
	short.Allow()
	time.Sleep(time.Millisecond)
	if !short.Allow() {
		t.Fatal("a warning after the interval was held back")
	}
}
