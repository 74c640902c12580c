#!/usr/bin/env bash
# Builds the release artefacts into dist/ (one command, no network):
#   reliable-mqtt_<v>_linux_{amd64,arm64,armv7}.tar.gz  static binary, README.md,
#       LICENSE, THIRD_PARTY, config/, resources/
#   reliable-mqtt_<v>_{amd64,arm64,armhf}.deb          binary, systemd unit,
#       /etc/reliable-mqtt/config.yaml, copyright
#   SHA256SUMS
#   reliable-mqtt_<v>_image_linux_{amd64,arm64,armv7}.tar  the Dockerfile's
#       image as an OCI archive (when buildah is installed; IMAGE=0 skips it)
# The version is $VERSION, else `git describe --tags --dirty` (the release tag,
# or tag-N-g<commit> after it), else "devel" (no tag); the build date is the
# commit's time, so the same commit gives the same binaries.
set -euo pipefail
cd "$(dirname "$0")/.."

version=${VERSION:-$(git describe --tags --dirty 2>/dev/null || echo devel)}
commit=$(git rev-parse HEAD)
epoch=$(git log -1 --format=%ct)
date=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)
debversion=${version#v}
[[ $debversion =~ ^[0-9] ]] || debversion=0~$debversion # Debian's versions start with a digit
debversion=${debversion//-/+}
dist=dist
rm -rf "$dist"
mkdir -p "$dist/build"

# arch name in tarballs, GOARCH, GOARM, Debian's arch name
targets="amd64:amd64::amd64 arm64:arm64::arm64 armv7:arm:7:armhf"

build() { # name goarch goarm
  local out=$dist/build/linux-$1
  mkdir -p "$out"
  CGO_ENABLED=0 GOOS=linux GOARCH=$2 GOARM=$3 go build -trimpath -buildvcs=false \
    -ldflags "-s -w -X main.version=$version -X main.commit=$commit -X main.date=$date" \
    -o "$out/reliable-mqtt" ./cmd/reliable-mqtt
}

# reproducible archives: sorted, owned by root, dated at the commit
tarc() { tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" "$@"; }

tarball() { # name
  local name=reliable-mqtt_${version}_linux_$1 stage=$dist/stage/reliable-mqtt_${version}_linux_$1
  mkdir -p "$stage"
  cp "$dist/build/linux-$1/reliable-mqtt" README.md LICENSE THIRD_PARTY "$stage/"
  cp -r config resources "$stage/"
  tarc -C "$dist/stage" -cf - "$(basename "$stage")" | gzip -n9 >"$dist/$name.tar.gz"
}

deb() { # name debarch
  local root=$dist/deb-$2
  install -D -m 0755 "$dist/build/linux-$1/reliable-mqtt" "$root/usr/bin/reliable-mqtt"
  install -D -m 0644 packaging/reliable-mqtt.service "$root/lib/systemd/system/reliable-mqtt.service"
  install -D -m 0644 packaging/config.yaml "$root/etc/reliable-mqtt/config.yaml"
  install -d "$root/usr/share/doc/reliable-mqtt"
  cat LICENSE THIRD_PARTY >"$root/usr/share/doc/reliable-mqtt/copyright"
  install -d "$root/DEBIAN"
  install -m 0755 packaging/deb/postinst packaging/deb/prerm packaging/deb/postrm "$root/DEBIAN/"
  echo /etc/reliable-mqtt/config.yaml >"$root/DEBIAN/conffiles"
  cat >"$root/DEBIAN/control" <<CONTROL
Package: reliable-mqtt
Version: $debversion
Architecture: $2
Maintainer: reliable-mqtt maintainers <reliable-mqtt@users.noreply.github.com>
Installed-Size: $(du -sk --exclude=DEBIAN "$root" | cut -f1)
Section: net
Priority: optional
Homepage: https://github.com/reliable-mqtt/reliable-mqtt
Description: MQTT pipelines that keep every message through crashes and outages
 A Benthos distribution with a durable MQTT output (outbox), an input that
 acknowledges only after the pipeline's output succeeded, and a ledger that
 makes redeliveries harmless. Installs a hardened systemd unit (not enabled)
 and a default pipeline in /etc/reliable-mqtt/config.yaml; state lives in
 /var/lib/reliable-mqtt.
CONTROL
  find "$root" -exec touch -h -d "@$epoch" {} +
  SOURCE_DATE_EPOCH=$epoch dpkg-deb --root-owner-group -Zgzip --build "$root" \
    "$dist/reliable-mqtt_${debversion}_$2.deb" >/dev/null
}

# image NAME PLATFORM: an OCI archive of the Dockerfile's image, built with
# buildah in a throwaway store (FROM scratch and COPY only: no emulation, no
# registry)
image() {
  local store=$dist/.containers
  local b=(buildah --root "$store/root" --runroot "$store/run" --storage-driver vfs)
  "${b[@]}" bud --quiet --isolation chroot --platform "$2" --build-arg ARCH="$1" \
    --timestamp "$epoch" -t "reliable-mqtt:$1" -f Dockerfile . >/dev/null
  "${b[@]}" push --quiet "reliable-mqtt:$1" "oci-archive:$dist/reliable-mqtt_${version}_image_linux_$1.tar:reliable-mqtt:$version"
  "${b[@]}" rmi --all --force >/dev/null
}

for t in $targets; do
  IFS=: read -r name goarch goarm debarch <<<"$t"
  echo "release: linux/$name"
  build "$name" "$goarch" "$goarm"
  tarball "$name"
  deb "$name" "$debarch"
done
if [ "${IMAGE:-1}" != 0 ] && command -v buildah >/dev/null; then
  for p in amd64:linux/amd64 arm64:linux/arm64 armv7:linux/arm/v7; do
    echo "release: image ${p#*:}"
    image "${p%%:*}" "${p#*:}"
  done
  rm -rf "$dist/.containers"
fi
(cd "$dist" && sha256sum -- *.tar.gz *.deb $(ls *_image_*.tar 2>/dev/null) >SHA256SUMS)
rm -rf "$dist/stage" "$dist"/deb-*
ls -l "$dist"
