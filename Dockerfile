# syntax=docker/dockerfile:1
#
# The gpu-operator image: one static binary on an empty base.
#
#   docker build -t gpu-operator:dev .
#
# The binary is built for x86_64-unknown-linux-musl (rustls with ring, no OpenSSL: nothing to link
# dynamically). It needs no CA bundle: in a cluster kube trusts the service account's ca.crt; see
# docs/image.md for what was verified.

ARG RUST_VERSION=1.89

FROM rust:${RUST_VERSION}-alpine AS build
ARG TARGET=x86_64-unknown-linux-musl
# ring compiles C and assembly; musl-dev provides the C library headers and crt files for static linking.
RUN apk add --no-cache musl-dev && rustup target add "${TARGET}"
WORKDIR /src
COPY . .
# Symbols are stripped (the release profile keeps line tables for local builds' backtraces).
ENV CARGO_PROFILE_RELEASE_STRIP=symbols
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --target "${TARGET}" -p gpuop-operator --bin gpu-operator \
    && cp "target/${TARGET}/release/gpu-operator" /gpu-operator

FROM scratch
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="gpu-operator" \
      org.opencontainers.image.description="GPU operator for Kubernetes, API-compatible with NVIDIA's (ClusterPolicy, NVIDIADriver), written in Rust" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
COPY --from=build /gpu-operator /gpu-operator
USER 65532:65532
ENTRYPOINT ["/gpu-operator"]
CMD ["--help"]
