#!/bin/sh
# Flash wear: bytes the block device is asked to write per reading, at 100
# readings a second (RATE), for the append+fdatasync reference, the outbox (with
# commit_delay 0, 10 ms and 50 ms), the bbolt ledger, the embedded broker's
# store and the quickstart's gateway (publisher + edge broker + bridge), all
# in one run on one loop-mounted ext4 (BenchmarkFlash in flash_test.go says
# what each workload is). Needs root (losetup, mount).
#
#   sudo tests/bench/flash.sh                 # N=1000 readings each
#   sudo N=3000 tests/bench/flash.sh
#   sudo RATE=1000 N=10000 tests/bench/flash.sh     # readings a second
#   sudo FLASH_ONLY=reference,outbox tests/bench/flash.sh
#   sudo RELIABLE_MQTT_BIN=/path/to/reliable-mqtt tests/bench/flash.sh
#
# Prints the raw `go test` lines, then each figure and its ratio to the
# reference of the same run.
set -eu
cd "$(dirname "$0")/../.."
N="${N:-1000}"
RATE="${RATE:-100}"
work="$(mktemp -d)"
out="$work/out"
img="$work/ext4.img"
mnt="$work/mnt"
loop=""
cleanup() {
	if mountpoint -q "$mnt" 2>/dev/null; then umount "$mnt"; fi
	if [ -n "$loop" ]; then losetup -d "$loop"; fi
	rm -rf "$work"
}
trap cleanup EXIT
if [ -z "${RELIABLE_MQTT_BIN:-}" ]; then
	go build -o "$work/reliable-mqtt" ./cmd/reliable-mqtt
	RELIABLE_MQTT_BIN="$work/reliable-mqtt"
fi
export RELIABLE_MQTT_BIN

# A 1 GiB image, allocated in full so the loop device's own writes do not
# grow a sparse file under it.
fallocate -l 1G "$img"
mkfs.ext4 -q -F "$img"
loop="$(losetup --find --show "$img")"
mkdir -p "$mnt"
mount "$loop" "$mnt"

FLASH_DIR="$mnt" FLASH_DEV="$(basename "$loop")" FLASH_N="$N" FLASH_RATE="$RATE" FLASH_ONLY="${FLASH_ONLY:-}" \
	go test -run '^$' -bench '^BenchmarkFlash$' -benchtime=1x -count=1 -timeout 60m ./tests/bench/ | tee "$out"

awk -v n="$N" -v rate="$RATE" '
/^BenchmarkFlash\// {
	name = $1; sub(/-[0-9]+$/, "", name); sub(/^BenchmarkFlash\//, "", name)
	for (i = 3; i < NF; i++) if ($(i+1) == "devB/reading") v[name] = $i
	order[++k] = name
}
END {
	ref = v["reference"]
	printf "\ndevice bytes per reading at %d readings/s, %d readings (same run):\n", rate, n
	for (i = 1; i <= k; i++) {
		name = order[i]
		if (ref > 0) printf "  %-24s %9.0f  %5.2fx reference\n", name, v[name], v[name] / ref
		else printf "  %-24s %9.0f\n", name, v[name]
	}
}' "$out"
