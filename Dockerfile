# Multi-stage build: cargo-chef caches the dependency build in its own layer, so a change to
# the project's code rebuilds only the project. Two images come out of one build, each
# Debian slim with one binary and a non-root user:
# - `runtime` (the last stage, what `docker build .` makes): the service alone, `seckill`;
# - `loadtest` (`docker build --target loadtest .`): the load tester of the demo stack.

# The builder and the runtime are both Debian bookworm, so the binaries find the glibc they
# were linked against.
FROM rust:1-bookworm AS chef
# protoc and its well-known types, which etcd-client's build script needs (it compiles
# etcd's protocol files); the official image has neither.
RUN apt-get update \
 && apt-get install -y --no-install-recommends protobuf-compiler libprotobuf-dev \
 && rm -rf /var/lib/apt/lists/*
RUN cargo install cargo-chef --locked
WORKDIR /src
# The query macros check SQL against the committed `.sqlx/` data: no database at build time.
ENV SQLX_OFFLINE=true

FROM chef AS planner
COPY . .
RUN cargo chef prepare --recipe-path recipe.json

FROM chef AS builder
COPY --from=planner /src/recipe.json recipe.json
# The same packages as the build below: the dependencies are compiled with the features
# these two need, so the build that follows finds them all compiled.
RUN cargo chef cook --release --locked --recipe-path recipe.json --package seckill --package loadtest
COPY . .
RUN cargo build --release --locked -p seckill -p loadtest

# The system's certificate authorities, for TLS links given no CA file of their own.
FROM debian:bookworm-slim AS base
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home seckill

FROM base AS loadtest
COPY --from=builder /src/target/release/loadtest /usr/local/bin/
USER seckill
CMD ["loadtest"]

# No shell tools beyond Debian slim's own: health checks use bash (docker-compose.yml).
FROM base AS runtime
COPY --from=builder /src/target/release/seckill /usr/local/bin/
USER seckill
# Reachable from outside the container (`docker run -p 8080:8080 seckill:local`); the
# binary's own default is 127.0.0.1:8080. The operators' listener (admin routes, /metrics,
# /readyz) on 9080, for probes and Prometheus on the container network: publish it to
# operators only, never to buyers.
ENV BIND_ADDR=0.0.0.0:8080
ENV OPS_BIND_ADDR=0.0.0.0:9080
EXPOSE 8080
EXPOSE 9080
CMD ["seckill"]
