// Package failpoint lets crash tests kill a real process at an exact point of
// the delivery path, e.g. after a transaction committed and before the PUBACK.
//
// Failpoints are off unless the environment variable RELIABLE_MQTT_FAILPOINTS
// is set when the process starts, so production runs pay one atomic load per
// point. The variable holds comma-separated entries "name" or "name=N": the
// process SIGKILLs itself the first time (or the Nth time) it reaches the
// point with that name.
package failpoint

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
)

// EnvVar names the environment variable that arms failpoints.
const EnvVar = "RELIABLE_MQTT_FAILPOINTS"

// Names of the points the plugins define.
const (
	// OutboxAppended: reliable_mqtt_out's outbox append committed (fsync'd),
	// Write has not returned.
	OutboxAppended = "outbox-appended"
	// BeforeSourceAck: reliable_mqtt_in's pipeline acknowledged a message and
	// its delivery hooks ran, the PUBACK/PUBREC has not been sent.
	BeforeSourceAck = "before-source-ack"
	// SQLCommitted: dedup_ledger's SQL transaction (ledger row + apply
	// statements) committed, the message has not moved on and is not
	// acknowledged.
	SQLCommitted = "sql-committed"
	// CompactCopied: boltfile's compaction at open wrote and fsync'd the
	// copy, the original file is not yet replaced.
	CompactCopied = "compact-copied"
	// CompactRenamed: the copy has replaced the original, the directory is
	// not yet fsync'd.
	CompactRenamed = "compact-renamed"
	// CreateWritten: boltfile wrote and fsync'd a new file under its
	// temporary name, it is not yet renamed into place.
	CreateWritten = "create-written"
	// CompactDone: the directory is fsync'd, the file is not yet reopened.
	CompactDone = "compact-done"
)

var (
	mu    sync.Mutex
	armed = parse(os.Getenv(EnvVar)) // name -> hits left before the kill
)

func parse(v string) map[string]int {
	if v == "" {
		return nil
	}
	out := map[string]int{}
	for _, item := range strings.Split(v, ",") {
		name, count, found := strings.Cut(strings.TrimSpace(item), "=")
		n := 1
		if found {
			var err error
			if n, err = strconv.Atoi(count); err != nil || n < 1 {
				fmt.Fprintf(os.Stderr, "failpoint: ignoring %q: count must be a positive integer\n", item)
				continue
			}
		}
		out[name] = n
	}
	return out
}

// Hit marks that the process reached the named point. When the point is
// armed and this is the hit it waits for, the process kills itself with
// SIGKILL: no deferred function, no flush, no clean disconnect.
func Hit(name string) {
	if armed == nil {
		return
	}
	mu.Lock()
	left, ok := armed[name]
	if ok {
		left--
		armed[name] = left
	}
	mu.Unlock()
	if ok && left == 0 {
		fmt.Fprintf(os.Stderr, "failpoint %s: killing process %d\n", name, os.Getpid())
		// os.Process.Kill is SIGKILL on Unix and TerminateProcess on
		// Windows: no handler runs either way, and the binary builds for both.
		if p, err := os.FindProcess(os.Getpid()); err == nil {
			_ = p.Kill()
		}
		select {} // the kill is on its way
	}
}
