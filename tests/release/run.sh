#!/usr/bin/env bash
# Release checks, run by .ci/run after the Go tests (root needed for dpkg):
#   1. tools/release.sh builds the tarballs, .debs, images and SHA256SUMS
#      (one build per architecture, reused by every check below);
#   2. each tarball's binary prints its version and commit and lints every
#      config; the arm64 and armv7 ones run under qemu-user-static, through
#      the README's quickstart on the embedded brokers;
#   3. the amd64 .deb is installed, its unit verified, its config linted by
#      the installed binary, then removed (state stays) and purged (it goes);
#   4. the amd64 image, loaded from its OCI archive, runs its binary as user
#      65532 with the state volume and port 4195 declared;
#   5. examples/custom-distribution builds and lints;
#   6. a plain `go build` in a git checkout stamps the commit by itself.
# Prints what it measured (sizes, arm64 quickstart RSS, step times).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD

need() { # command package
  command -v "$1" >/dev/null 2>&1 && return 0
  echo "tests/release: installing $2" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
}
need qemu-aarch64-static qemu-user-static
need buildah buildah
need systemd-analyze systemd
need dpkg-deb dpkg

tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  if dpkg-query -W reliable-mqtt >/dev/null 2>&1; then dpkg --purge reliable-mqtt >/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }
t0=$SECONDS
step() { echo "== $* (t=$((SECONDS - t0))s)"; }

step "release build"
./tools/release.sh >"$tmp/release.log" 2>&1 || { cat "$tmp/release.log"; fail "tools/release.sh"; }
commit=$(git rev-parse HEAD)
ver=$(ls dist/*_linux_amd64.tar.gz | sed -E 's|dist/reliable-mqtt_(.*)_linux_amd64.tar.gz|\1|')
for f in dist/reliable-mqtt_"$ver"_linux_{amd64,arm64,armv7}.tar.gz dist/reliable-mqtt_*_{amd64,arm64,armhf}.deb; do
  [ -s "$f" ] || fail "missing $f"
done
(cd dist && sha256sum --quiet -c SHA256SUMS) || fail "SHA256SUMS does not match"

# emu ARCH: the emulator that runs that architecture's binary here, if any
emu() { case $1 in arm64) echo qemu-aarch64-static ;; armv7) echo qemu-arm-static ;; esac; }
# run ARCH ARGS...: the binary of that tarball
run() { local arch=$1; shift; $(emu "$arch") "$tmp/$arch/reliable-mqtt" "$@"; }

# The README's quickstart command, from the unpacked tarball, for 10 s; at
# least one reading must be applied by the consumer: "applied event <id>" is
# the line its log processor writes after the ledger commit
# (config/consumer.yaml).
applied="applied event "
quickstart() { # arch
  local arch=$1 dir=$tmp/$1 log=$tmp/$1-quickstart.log start=$SECONDS
  (cd "$dir" && exec $(emu "$arch") ./reliable-mqtt streams --no-api -o resources/quickstart-root.yaml \
    config/publisher.yaml config/bridge.yaml config/consumer.yaml) >"$log" 2>&1 &
  local pid=$!
  pids+=("$pid")
  # bounded: 10 s of running, at most 60 s waiting for a first delivery
  while [ $((SECONDS - start)) -lt 60 ]; do
    sleep 1
    kill -0 "$pid" 2>/dev/null || { cat "$log"; fail "$arch quickstart exited early"; }
    if [ $((SECONDS - start)) -ge 10 ] && grep -q "$applied" "$log"; then break; fi
  done
  local rss
  rss=$(awk '/^VmHWM/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
  kill -TERM "$pid"
  local waited=0
  while kill -0 "$pid" 2>/dev/null && [ $waited -lt 30 ]; do sleep 1; waited=$((waited + 1)); done
  kill -0 "$pid" 2>/dev/null && { kill -9 "$pid"; fail "$arch quickstart did not stop within 30 s of SIGTERM"; }
  wait "$pid" || { tail -n 20 "$log"; fail "$arch quickstart exited non-zero after SIGTERM"; }
  local n
  n=$(grep -c "$applied" "$log" || true)
  [ "$n" -ge 1 ] || { tail -n 40 "$log"; fail "$arch quickstart: no '$applied' line in $((SECONDS - start)) s"; }
  echo "$arch quickstart: $n readings applied in $((SECONDS - start)) s${rss:+, peak RSS ${rss} KiB (qemu process)}"
}

for arch in amd64 arm64 armv7; do
  step "$arch tarball"
  mkdir -p "$tmp/$arch"
  tar -xzf "dist/reliable-mqtt_${ver}_linux_$arch.tar.gz" -C "$tmp/$arch" --strip-components=1
  for f in reliable-mqtt README.md LICENSE THIRD_PARTY config resources; do
    [ -e "$tmp/$arch/$f" ] || fail "$arch tarball lacks $f"
  done
  case $(file "$tmp/$arch/reliable-mqtt") in *"statically linked"*) ;; *) fail "$arch binary is not static" ;; esac
  out=$(run "$arch" --version)
  echo "$out" | grep -q "^Version: $ver (commit ${commit:0:12})$" || fail "$arch --version printed: $out"
  echo "$out" | grep -q "^Date: 20" || fail "$arch --version has no build date: $out"
  help=$(run "$arch" --help)
  case $help in *benthos.dev*) fail "$arch --help links benthos.dev" ;; *"reliable-mqtt - "*) ;; *) fail "$arch --help: $help" ;; esac
  (cd "$tmp/$arch" && run "$arch" lint config/*.yaml resources/*.yaml) || fail "$arch lint"
  echo "$arch binary: $(stat -c %s "$tmp/$arch/reliable-mqtt") bytes, tarball $(stat -c %s "dist/reliable-mqtt_${ver}_linux_$arch.tar.gz") bytes"
  if [ "$arch" != amd64 ]; then quickstart "$arch"; fi
done

step "amd64 HTTP server: /ready, /ping; log lines name the service"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat >"$tmp/ready.yaml" <<EOF
http: { address: 127.0.0.1:$port }
input: { generate: { interval: 1s, mapping: 'root = "x"' } }
output: { drop: {} }
EOF
"$tmp/amd64/reliable-mqtt" -c "$tmp/ready.yaml" >"$tmp/ready.log" 2>&1 &
pids+=($!)
code=000
for _ in $(seq 1 30); do
  code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/ready" || true)
  [ "$code" = 200 ] && break
  sleep 0.5
done
[ "$code" = 200 ] || { cat "$tmp/ready.log"; fail "/ready answered $code"; }
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/ping" || true)
[ "$code" = 200 ] || fail "/ping answered $code"
kill -TERM "${pids[-1]}"
grep -q '@service=reliable-mqtt' "$tmp/ready.log" || fail "log lines do not carry @service=reliable-mqtt"

step ".deb install, verify, remove, purge"
deb=$(ls dist/reliable-mqtt_*_amd64.deb)
if dpkg-query -W reliable-mqtt >/dev/null 2>&1; then fail "reliable-mqtt is already installed on this machine; not touching it"; fi
dpkg-deb --contents "$deb" | awk '{print $6}' >"$tmp/deb-files"
dpkg -i "$deb" >/dev/null
systemd-analyze verify /lib/systemd/system/reliable-mqtt.service || fail "systemd-analyze verify"
systemd-analyze security --offline=true /lib/systemd/system/reliable-mqtt.service 2>/dev/null | tail -n 1
/usr/bin/reliable-mqtt lint /etc/reliable-mqtt/config.yaml || fail "installed binary does not lint the installed config"
/usr/bin/reliable-mqtt --version | grep -q "commit ${commit:0:12}" || fail "installed binary's version"
# what a running service leaves: an outbox in its state directory
mkdir -p /var/lib/reliable-mqtt && echo state >/var/lib/reliable-mqtt/outbox.db
dpkg -r reliable-mqtt >/dev/null
[ ! -e /usr/bin/reliable-mqtt ] || fail "dpkg -r left the binary"
[ ! -e /lib/systemd/system/reliable-mqtt.service ] || fail "dpkg -r left the unit"
[ -e /var/lib/reliable-mqtt/outbox.db ] || fail "dpkg -r removed the state directory"
[ -e /etc/reliable-mqtt/config.yaml ] || fail "dpkg -r removed the config (a conffile)"
dpkg --purge reliable-mqtt >/dev/null
[ ! -e /var/lib/reliable-mqtt ] || fail "purge left /var/lib/reliable-mqtt"
[ ! -e /etc/reliable-mqtt ] || fail "purge left /etc/reliable-mqtt"
echo "deb: $(stat -c %s "$deb") bytes; installs: $(grep -v '/$' "$tmp/deb-files" | tr '\n' ' ')"

step "container image (OCI archive from tools/release.sh)"
b() { buildah --root "$tmp/containers" --runroot "$tmp/containers-run" --storage-driver vfs "$@"; }
for arch in amd64 arm64 armv7; do
  [ -s "dist/reliable-mqtt_${ver}_image_linux_$arch.tar" ] || fail "no image archive for $arch"
done
ctr=$(b from --quiet "oci-archive:dist/reliable-mqtt_${ver}_image_linux_amd64.tar")
out=$(b run --isolation chroot "$ctr" -- /usr/bin/reliable-mqtt --version)
echo "$out" | grep -q "commit ${commit:0:12}" || fail "image --version printed: $out"
b run --isolation chroot "$ctr" -- /usr/bin/reliable-mqtt lint /etc/reliable-mqtt/config.yaml || fail "image lint"
img=$(b inspect --format '{{.FromImageID}}' "$ctr")
cfg=$(b inspect --type image --format '{{.OCIv1.Config.User}} {{range $k, $v := .OCIv1.Config.Volumes}}{{$k}}{{end}} {{range $k, $v := .OCIv1.Config.ExposedPorts}}{{$k}}{{end}}' "$img")
[ "$cfg" = "65532:65532 /var/lib/reliable-mqtt 4195/tcp" ] || fail "image config: $cfg"
owner=$(stat -c %u:%g "$(b mount "$ctr")/var/lib/reliable-mqtt")
b umount "$ctr" >/dev/null
[ "$owner" = "65532:65532" ] || fail "/var/lib/reliable-mqtt in the image is owned by $owner"
b rm "$ctr" >/dev/null
echo "image: user, volume, port: $cfg; $(stat -c %s "dist/reliable-mqtt_${ver}_image_linux_amd64.tar") bytes"

step "examples/custom-distribution"
(cd examples/custom-distribution && go vet ./... && go build -o "$tmp/my-benthos" .) ||
  fail "example build; after a change to the main go.mod, update its go.mod and go.sum:
  (cd examples/custom-distribution && cat ../../go.sum >>go.sum && GOPROXY=off GOFLAGS=-mod=mod go mod tidy)"
"$tmp/my-benthos" lint config/*.yaml || fail "example distribution does not lint config/"
case $("$tmp/my-benthos" list outputs) in *reliable_mqtt_out*) ;; *) fail "example distribution lacks reliable_mqtt_out" ;; esac

step "go build stamps the commit without -ldflags"
src=$root
if [ ! -d .git ]; then # a worktree: go finds no VCS in it; use a clone
  git clone -q "$root" "$tmp/src" && src=$tmp/src
fi
(cd "$src" && go build -buildvcs=true -o "$tmp/plain" ./cmd/reliable-mqtt) || fail "plain go build"
"$tmp/plain" --version | grep -q "commit ${commit:0:12}" || fail "plain build: $("$tmp/plain" --version)"

step "done"
echo "tests/release: every check passed in $((SECONDS - t0)) s"
