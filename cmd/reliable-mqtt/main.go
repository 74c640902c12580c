// Command reliable-mqtt is a Benthos distribution whose MQTT components
// survive crashes, outages and broker restarts.
package main

import (
	"context"
	"log/slog"
	"os"

	"github.com/redpanda-data/benthos/v4/public/service"

	_ "github.com/redpanda-data/benthos/v4/public/components/io"
	_ "github.com/redpanda-data/benthos/v4/public/components/pure"
	_ "github.com/redpanda-data/benthos/v4/public/components/pure/extended"

	"github.com/reliable-mqtt/reliable-mqtt/internal/inspect"
	_ "github.com/reliable-mqtt/reliable-mqtt/plugin/all"
)

func main() {
	useOwnHelpExamples()
	service.RunCLI(context.Background(),
		service.CLIOptSetBinaryName(productName),
		service.CLIOptSetProductName(productName),
		service.CLIOptSetVersion(buildStamp()),
		service.CLIOptSetMainSchemaFrom(configSchema),
		service.CLIOptSetDefaultConfigPaths(defaultConfigPaths...),
		service.CLIOptAddCommand(inspect.OutboxCommand()), service.CLIOptAddCommand(inspect.LedgerCommand()),
		service.CLIOptAddTeeLogger(slog.New(httpGuard{exit: os.Exit})),
	)
}
