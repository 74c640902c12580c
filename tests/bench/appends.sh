#!/bin/sh
# Durable appends through the real binary, beside the two ceilings under it,
# in one run:
#
#   BareBoltGroupCommit/perTx=N   bbolt alone: one committer, N (64, 1024)
#                                 records per fsync'd transaction
#   Append64Writers               outbox.Append, 64 writers (internal/outbox)
#   AppendBatch64x64              outbox.AppendBatch, 64 writers x 64 entries
#   BinaryAppends/batching=...    generate -> reliable_mqtt_out, broker
#                                 unreachable, 64 in flight (tests/bench):
#                                 none, output64 (the output's batching
#                                 policy), input64 (a source batching by 64)
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
go test -run '^$' -bench 'BareBoltGroupCommit|Append64Writers|AppendBatch64x64' -benchtime="${N}x" -count=1 -timeout 20m ./internal/outbox/ | tee "$out"
go test -run '^$' -bench 'BinaryAppends' -benchtime="${N}x" -count=1 -timeout 20m ./tests/bench/ | tee -a "$out"
echo "load after: $(uptime)"

awk '
/^Benchmark/ {
	name = $1; sub(/-[0-9]+$/, "", name); sub(/^Benchmark/, "", name)
	for (i = 3; i < NF; i++) if ($(i+1) == "msgs/s") rate[name] = $i
}
function ratio(label, a, b, note) {
	if (a > 0 && b > 0) printf "  %-44s %5.0f%%%s\n", label, 100 * a / b, note
}
END {
	b64 = rate["BareBoltGroupCommit/perTx=64"]; b1k = rate["BareBoltGroupCommit/perTx=1024"]
	printf "\nratios (same run):\n"
	ratio("outbox Append (64 writers) / bare perTx=64", rate["Append64Writers"], b64, "")
	ratio("outbox AppendBatch 64x64 / bare perTx=1024", rate["AppendBatch64x64"], b1k, "")
	ratio("binary, no batching / bare perTx=64", rate["BinaryAppends/batching=none"], b64, "")
	ratio("binary, output batching 64 / bare perTx=1024", rate["BinaryAppends/batching=output64"], b1k, "  (target >= 80%)")
	ratio("binary, input batches of 64 / bare perTx=1024", rate["BinaryAppends/batching=input64"], b1k, "  (target >= 80%)")
	for (n in rate) if (n ~ /^BinaryAppends/) printf "  %-44s %6.0f msgs/s (target >= 50000)\n", n, rate[n]
}' "$out"
