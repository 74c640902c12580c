// Command my-benthos is an example of a Benthos distribution that adds the
// reliable-mqtt plugins to its own build: the same three blank imports work
// in any program built on github.com/redpanda-data/benthos/v4 (see
// docs/embedding.md).
package main

import (
	"context"

	"github.com/redpanda-data/benthos/v4/public/service"

	// Benthos's core components; swap for the bundles your build uses.
	_ "github.com/redpanda-data/benthos/v4/public/components/io"
	_ "github.com/redpanda-data/benthos/v4/public/components/pure"
	_ "github.com/redpanda-data/benthos/v4/public/components/pure/extended"

	// reliable_mqtt_in, reliable_mqtt_out and dedup_ledger.
	_ "github.com/reliable-mqtt/reliable-mqtt/plugin/all"
)

func main() {
	service.RunCLI(context.Background(),
		service.CLIOptSetBinaryName("my-benthos"),
		service.CLIOptSetProductName("my-benthos"),
	)
}
