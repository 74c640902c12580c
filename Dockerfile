# The reliable-mqtt container image: the static release binary on an empty
# base, run as a non-root user.
#
#   tools/release.sh                       # builds dist/build/linux-<arch>/
#   buildah bud --build-arg ARCH=arm64 -t reliable-mqtt .    # or docker build
#
# The first stage gathers the files: the binary tools/release.sh built for
# ARCH (the same bytes as in the tarball and the .deb, CGO_ENABLED=0, so
# nothing else is needed to run it), the default pipeline, and an empty
# state directory. The image gets those and nothing else: no shell, no
# package manager, no compiler.
ARG ARCH=amd64

FROM scratch AS files
ARG ARCH
COPY dist/build/linux-${ARCH}/reliable-mqtt /usr/bin/reliable-mqtt
COPY packaging/config.yaml /etc/reliable-mqtt/config.yaml
COPY packaging/image/ /var/lib/reliable-mqtt/

FROM scratch
COPY --from=files /usr/bin/reliable-mqtt /usr/bin/reliable-mqtt
COPY --from=files /etc/reliable-mqtt/ /etc/reliable-mqtt/
COPY --from=files --chown=65532:65532 /var/lib/reliable-mqtt/ /var/lib/reliable-mqtt/
USER 65532:65532
WORKDIR /var/lib/reliable-mqtt
ENV DATA_DIR=/var/lib/reliable-mqtt
# Outbox and ledger files: keep them on a volume, or a new container
# starts with an empty outbox and forgets which events it applied.
VOLUME /var/lib/reliable-mqtt
# Benthos's HTTP server: GET /ready answers 200 once every input and output
# is connected (use it as the readiness probe), /ping 200 while the
# process runs (liveness).
EXPOSE 4195
ENTRYPOINT ["/usr/bin/reliable-mqtt"]
CMD ["-c", "/etc/reliable-mqtt/config.yaml", "--set", "http.address=0.0.0.0:4195"]
