package harness

import (
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"
)

// Rand returns the random source of a randomised test, seeded from the
// environment variable env when set and from the clock otherwise, and logs
// the seed so that a failure can be replayed with the same choices.
// stream separates the sources of different tests given one seed.
func Rand(t testing.TB, env string, stream uint64) *rand.Rand {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(env); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: not an unsigned integer: %v", env, s, err)
		}
		seed = v
	}
	t.Logf("random seed %d (replay with %s=%d)", seed, env, seed)
	return rand.New(rand.NewPCG(seed, stream))
}
