package main

import (
	"strings"

	ucli "github.com/urfave/cli/v2"
)

// helpExamples replace Benthos's description in `--help`, whose
// `create kafka//file` fails here (this distribution has no kafka). Each
// line runs as shown in the directory of a release tarball
// (tests/e2e/cli_test.go runs them).
const helpExamples = `Run a pipeline, or choose a command:

  reliable-mqtt -c ./config/publisher.yaml
  reliable-mqtt lint ./config/*.yaml
  reliable-mqtt list inputs outputs
  reliable-mqtt create generate//reliable_mqtt_out > ./my-pipeline.yaml
  reliable-mqtt outbox stat ./reliable-mqtt-data/publisher-outbox.db`

// useOwnHelpExamples swaps the description in urfave/cli's application
// help template (Benthos sets it without an option to change it).
func useOwnHelpExamples() {
	ucli.AppHelpTemplate = strings.Replace(ucli.AppHelpTemplate,
		`{{template "descriptionTemplate" .}}`, strings.ReplaceAll(strings.ReplaceAll(helpExamples, "\n", "\n   "), "\n   \n", "\n\n"), 1)
}
