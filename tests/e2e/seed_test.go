package e2e

import (
	"math/rand/v2"
	"testing"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// SeedEnv replays a randomised test: E2E_SEED=<the seed it logged>.
const SeedEnv = "E2E_SEED"

// testRand returns the random source of a randomised test (harness.Rand
// with SeedEnv); stream separates the sources of different tests.
func testRand(t *testing.T, stream uint64) *rand.Rand { return harness.Rand(t, SeedEnv, stream) }
