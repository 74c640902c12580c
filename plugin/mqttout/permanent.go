package mqttout

import "github.com/reliable-mqtt/reliable-mqtt/internal/codec"

// PermanentPrefix starts the message of every error Write returns for a
// message that can never be published (too large, an invalid topic or event
// ID, a payload that cannot be enveloped). Retrying it cannot help, so a
// pipeline routes it instead: a `fallback` output passes the error text on
// as metadata `fallback_error`, and `@fallback_error.has_prefix("permanent")`
// picks these out. Every other error (a broker away, a disk that fails) is
// transient: the message is not acknowledged and is delivered again.
const PermanentPrefix = codec.PermanentPrefix
