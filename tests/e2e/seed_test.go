package e2e

import (
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"
)

// SeedEnv replays a randomised test: E2E_SEED=<the seed it logged>.
const SeedEnv = "E2E_SEED"

// testRand returns the random source of a randomised test, seeded from
// $E2E_SEED when set and from the clock otherwise, and logs the seed so
// that a failure can be replayed with the same kill times and streams.
// stream separates the sources of different tests given one seed.
func testRand(t *testing.T, stream uint64) *rand.Rand {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(SeedEnv); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: not an unsigned integer: %v", SeedEnv, s, err)
		}
		seed = v
	}
	t.Logf("random seed %d (replay with %s=%d)", seed, SeedEnv, seed)
	return rand.New(rand.NewPCG(seed, stream))
}
