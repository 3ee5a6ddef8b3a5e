# fencegate container image: a static-enough release binary on a slim Debian base, run as a
# non-root user, with the embedded store by default.
#
#   docker build -t fencegate .
#   docker run -p 8080:8080 -p 127.0.0.1:9090:9090 -e FENCEGATE_ADMIN_TOKEN=... \
#     -v fencegate-data:/var/lib/fencegate \
#     -v "$PWD/my.toml:/etc/fencegate/fencegate.toml:ro" -v "$PWD/tls:/etc/fencegate/tls:ro" fencegate
#
# The configuration is read from /etc/fencegate/fencegate.toml (config/docker.toml by default);
# the embedded store lives in the volume /var/lib/fencegate.

# The base images, swappable for locally made ones (scripts/image.sh builds this file with buildah
# from bases it makes with debootstrap, where no registry is reachable).
ARG BUILD_IMAGE=rust:1-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

FROM ${BUILD_IMAGE} AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY build.rs ./
COPY src ./src
# PostgreSQL migrations are embedded in the binary at build time, and so is the admin API's
# OpenAPI document (GET /admin/openapi.json).
COPY migrations ./migrations
COPY docs/admin-openapi.json ./docs/admin-openapi.json
# Cargo.toml declares the bench and example targets, so their sources must be present.
COPY benches ./benches
COPY examples ./examples
# No debug info in the image (the release profile keeps some for profiling).
ENV CARGO_PROFILE_RELEASE_DEBUG=0
RUN cargo build --release --locked --bin fencegate

FROM ${RUNTIME_IMAGE}
# The web roots for https:// upstreams are compiled into the binary; the system's CA bundle is
# there for private CAs appended to it and for tools run in the container. Certificates and keys
# for [server.tls] / [routes.upstream_tls] are mounted, e.g. at /etc/fencegate/tls.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/fencegate --no-create-home fencegate \
    && mkdir -p /var/lib/fencegate /etc/fencegate \
    && chown fencegate:fencegate /var/lib/fencegate
COPY --from=build /src/target/release/fencegate /usr/local/bin/fencegate
COPY config/docker.toml /etc/fencegate/fencegate.toml
USER 10001:10001
VOLUME ["/var/lib/fencegate"]
# 8080: the data plane; 9090: the admin listener (metrics, /healthz, /readyz, admin API).
EXPOSE 8080 9090
ENTRYPOINT ["/usr/local/bin/fencegate"]
CMD ["serve", "--config", "/etc/fencegate/fencegate.toml"]
# Healthy means ready: `fencegate health` reads the [admin] listener's address from the
# configuration and GETs /readyz (exit 0 on 200: the store answers and is trusted; 1 otherwise;
# `--live` would ask /healthz). The image has no HTTP client, so the binary asks itself. A
# configuration mounted over this one needs an [admin] table, or the check fails.
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["/usr/local/bin/fencegate", "health", "--config", "/etc/fencegate/fencegate.toml"]
