#!/bin/sh
# Durable appends through the real binary, beside the two ceilings under it,
# in one run:
#
#   BareBoltGroupCommit/perTx=64  bbolt alone: one committer, 64 records per
#                                 fsync'd transaction (internal/outbox)
#   Append64Writers               outbox.Append, 64 writers (internal/outbox)
#   BinaryAppends                 generate -> reliable_mqtt_out, broker
#                                 unreachable, 64 in flight (tests/bench)
#
#   tests/bench/appends.sh                    # 200,000 records each
#   N=50000 tests/bench/appends.sh            # a quicker look
#   BENCH_CPUPROFILE=/tmp/bin.pprof tests/bench/appends.sh   # + a 10 s CPU
#                                 profile of the binary during its fill
#   RELIABLE_MQTT_BIN=/path/to/reliable-mqtt tests/bench/appends.sh
#                                 # measure that build instead of building
#
# Prints the machine's load, the raw `go test` lines, then the ratios.
set -eu
cd "$(dirname "$0")/../.."
N="${N:-200000}"
out="$(mktemp)"
dir="$(mktemp -d)"
trap 'rm -rf "$out" "$dir"' EXIT
if [ -z "${RELIABLE_MQTT_BIN:-}" ]; then
	go build -o "$dir/reliable-mqtt" ./cmd/reliable-mqtt
	RELIABLE_MQTT_BIN="$dir/reliable-mqtt"
fi
export RELIABLE_MQTT_BIN

echo "load before: $(uptime)"
go test -run '^$' -bench 'BareBoltGroupCommit/perTx=64$|Append64Writers' -benchtime="${N}x" -count=1 -timeout 20m ./internal/outbox/ | tee "$out"
go test -run '^$' -bench 'BinaryAppends' -benchtime="${N}x" -count=1 -timeout 20m ./tests/bench/ | tee -a "$out"
echo "load after: $(uptime)"

awk '
/^Benchmark/ {
	name = $1; sub(/-[0-9]+$/, "", name); sub(/^Benchmark/, "", name)
	for (i = 3; i < NF; i++) if ($(i+1) == "msgs/s") rate[name] = $i
}
END {
	bare = rate["BareBoltGroupCommit/perTx=64"]; ob = rate["Append64Writers"]; bin = rate["BinaryAppends"]
	printf "\nratios (same run):\n"
	if (bare > 0 && ob > 0)  printf "  outbox Append / bare bbolt    %5.0f%%\n", 100 * ob / bare
	if (bare > 0 && bin > 0) printf "  binary / bare bbolt           %5.0f%%  (target >= 80%%)\n", 100 * bin / bare
	if (ob > 0 && bin > 0)   printf "  binary / outbox Append        %5.0f%%\n", 100 * bin / ob
	if (bin > 0)             printf "  binary appends                %.0f msgs/s (target >= 50000)\n", bin
}' "$out"
