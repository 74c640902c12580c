package mqttin

import (
	"log"
	"os"

	paho "github.com/eclipse/paho.mqtt.golang"
)

// PAHO_DEBUG=1 go test ... prints paho's own packet-level log, which shows
// exactly which PUBACK/PUBREC left and when.
func init() {
	if os.Getenv("PAHO_DEBUG") != "" {
		paho.WARN = log.New(os.Stderr, "[paho warn] ", log.Lmicroseconds)
		paho.ERROR = log.New(os.Stderr, "[paho err] ", log.Lmicroseconds)
		paho.DEBUG = log.New(os.Stderr, "[paho dbg] ", log.Lmicroseconds)
	}
}
