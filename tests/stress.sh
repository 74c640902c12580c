#!/usr/bin/env bash
# Flake hunt: runs the tests of the given packages N times each while busy
# loops keep every core loaded, so that a test that races the machine's
# speed fails here rather than at random in CI.
#
#   tests/stress.sh ./tests/e2e/ ./plugin/...            # 5 runs, a loop per core
#   N=10 HOGS=4 RUN=Quickstart tests/stress.sh ./tests/e2e/
#
# N      runs of each package's tests (go test -count=N; default 5)
# HOGS   busy loops (default: one per core, nproc)
# RUN    go test -run pattern (default: every test)
# LOGS   directory for one log per package (default: a new one under /tmp)
# TIMEOUT go test -timeout for one package's N runs (default 90m)
#
# Packages run one at a time, in the order given (patterns expanded with
# go list), each with its own log; every failing package is listed at the
# end and the exit status is 1 if any failed. The busy loops are killed
# when the script exits, however it exits.
set -euo pipefail
cd "$(dirname "$0")/.."

N="${N:-5}"
HOGS="${HOGS:-$(nproc)}"
RUN="${RUN:-.}"
LOGS="${LOGS:-$(mktemp -d /tmp/stress.XXXXXX)}"
mkdir -p "$LOGS"
[ $# -gt 0 ] || { echo "usage: tests/stress.sh PACKAGE... (e.g. ./tests/e2e/ ./internal/...)" >&2; exit 2; }

hogs=()
bin_dir=$(mktemp -d)
cleanup() {
  for pid in "${hogs[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$bin_dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# One binary for every package, built before the load starts (as tests/run).
if [ -z "${RELIABLE_MQTT_BIN:-}" ]; then
  go build -o "$bin_dir/reliable-mqtt" ./cmd/reliable-mqtt
  export RELIABLE_MQTT_BIN="$bin_dir/reliable-mqtt"
fi
mapfile -t pkgs < <(go list "$@")

for _ in $(seq "$HOGS"); do
  ( while :; do :; done ) &
  hogs+=($!)
done
echo "stress: $N runs of ${#pkgs[@]} packages under $HOGS busy loops (pids ${hogs[*]}); logs in $LOGS"

failed=()
for pkg in "${pkgs[@]}"; do
  log="$LOGS/$(echo "${pkg#github.com/reliable-mqtt/reliable-mqtt/}" | tr / _).log"
  start=$(date +%s)
  if go test -count="$N" -p 1 -timeout "${TIMEOUT:-90m}" -run "$RUN" -v "$pkg" >"$log" 2>&1; then
    verdict=ok
  else
    verdict=FAIL
    failed+=("$pkg")
  fi
  printf '%-4s %-70s %5ds  %s\n' "$verdict" "$pkg" $(( $(date +%s) - start )) "$log"
  [ "$verdict" = ok ] || grep -E '^\s*--- FAIL|^panic:|timed out' "$log" | sort | uniq -c | head -20 || true
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "stress: ${#failed[@]} package(s) failed: ${failed[*]}"
  exit 1
fi
echo "stress: every package passed $N runs under load"
