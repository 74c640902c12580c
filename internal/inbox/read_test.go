package inbox

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Read skips a delivery whose connection is lost, waits for a message that
// arrives later, gives up with ctx, and reports ErrClosed after Close.
func TestReadSkipsStaleWaitsAndEnds(t *testing.T) {
	f := newFixture(t, Config{CleanSession: true})
	lost, c := newConn(), newConn()
	f.send(lost, "a/x", 1, 1, false)
	lost.lose()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	go f.send(c, "a/y", 1, 2, false)
	d, err := f.in.Read(ctx)
	if err != nil || d.Msg.Topic() != "a/y" {
		t.Fatalf("Read = %v, %v; want the live connection's a/y", d, err)
	}

	short, cancelShort := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancelShort()
	if _, err := f.in.Read(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Read with nothing to read returned %v, want the context's deadline", err)
	}

	f.in.Close()
	if _, err := f.in.Read(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Read after Close returned %v, want ErrClosed", err)
	}
}
