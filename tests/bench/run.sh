#!/bin/sh
# Runs the reliable_mqtt_out benchmarks once, against mosquitto on loopback,
# and prints each one's ratio to the figures measured in the same run.
#
#   tests/bench/run.sh            # 100,000 messages per benchmark
#   N=20000 tests/bench/run.sh    # a quicker look
#
# Needs mosquitto (PATH, /usr/sbin or $MOSQUITTO_BIN). Prints raw `go test`
# output first, then the ratios. Do not run it in a loop on a shared box.
# BinaryAppends (the real binary, no broker) is left to appends.sh,
# BacklogMemory (a 1M backlog) and the WAN benchmarks (WAN*: at Receive
# Maximum 20 over 300 ms, 100,000 messages would take half an hour) to
# their own commands (docs/performance.md), as PackWAN and PackLatency
# (100 readings/s) are (docs/packing.md).
# Chain runs the real binary (built once by the harness, or
# $RELIABLE_MQTT_BIN).
set -eu
cd "$(dirname "$0")/../.."
N="${N:-100000}"
out="$(mktemp)"
trap 'rm -f "$out"' EXIT

go test -run '^$' -bench . -skip '^Benchmark(BinaryAppends|BacklogMemory|WAN.*|PackWAN|PackLatency)$' -benchtime="${N}x" -count=1 -timeout 20m ./tests/bench/ | tee "$out"

awk -v n="$N" '
/^Benchmark/ {
	name = $1; sub(/-[0-9]+$/, "", name); sub(/^Benchmark/, "", name)
	for (i = 3; i < NF; i++) if ($(i+1) == "msgs/s") rate[name] = $i
}
END {
	printf "\nratios (same run, %d messages each):\n", n
	if (rate["BaselinePahoQoS1"] > 0 && rate["BrokerConfirm"] > 0)
		printf "  broker-confirm / paho baseline   %5.0f%%  (target >= 50%%)\n", 100 * rate["BrokerConfirm"] / rate["BaselinePahoQoS1"]
	for (w = 64; w <= 256; w *= 4) {
		e = rate["EndToEnd/window=" w]
		if (rate["BaselinePahoQoS1"] > 0 && e > 0)
			printf "  end-to-end (window %3d) / paho   %5.0f%%  (%.0f msgs/s, target >= 20000)\n", w, 100 * e / rate["BaselinePahoQoS1"], e
	}
	if (rate["BrokerConfirm"] > 0 && rate["BacklogRecovery"] > 0)
		printf "  backlog drain / live confirm     %5.0f%%  (target ~100%%)\n", 100 * rate["BacklogRecovery"] / rate["BrokerConfirm"]
	if (rate["BaselinePahoQoS1"] > 0 && rate["Chain/full"] > 0)
		printf "  chain (real processes) / paho    %5.0f%%  (%.0f msgs/s)\n", 100 * rate["Chain/full"] / rate["BaselinePahoQoS1"], rate["Chain/full"]
	if (rate["Pack/unpacked"] > 0 && rate["Pack/packed"] > 0)
		printf "  packed / unpacked end-to-end     %5.0f%%  (%.0f msgs/s; paho %.0f)\n", 100 * rate["Pack/packed"] / rate["Pack/unpacked"], rate["Pack/packed"], rate["Pack/paho_qos1"]
	if (rate["OutboxAppend64Writers"] > 0)
		printf "  outbox appends                   %.0f msgs/s (target >= 50000)\n", rate["OutboxAppend64Writers"]
}' "$out"
