# capc-health-shim container image with a container engine: `make image-docker` (docker, or
# CONTAINER_ENGINE=podman). The image CI builds and tests is `make image` (hack/release/image.go:
# no engine, no base image); this one is its equivalent for those who have an engine.
# Build stage: the release binary. Runtime stage: distroless cc (glibc + libgcc + a CA bundle,
# no shell), running as the non-root user 65532 — matches the Deployment's runAsNonRoot and
# readOnlyRootFilesystem (the shim writes no files).

FROM docker.io/library/rust:1.95-bookworm AS build
# The commit for `--version` (build.rs): the build context has no .git.
ARG CAPC_HEALTH_SHIM_COMMIT=unknown
ENV CAPC_HEALTH_SHIM_COMMIT=${CAPC_HEALTH_SHIM_COMMIT}
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
# the allocator's build settings (jemalloc with one arena)
COPY .cargo ./.cargo
COPY src ./src
# the product's own crates
COPY crates/cloudstack-api ./crates/cloudstack-api
COPY crates/verdict ./crates/verdict
COPY crates/capi-model ./crates/capi-model
# the dev-only workspace members: their manifests only (cargo resolves the whole workspace's
# lock file; none of their code is compiled or copied)
COPY crates/cloudstack-sim/Cargo.toml ./crates/cloudstack-sim/Cargo.toml
COPY crates/test-support/Cargo.toml ./crates/test-support/Cargo.toml
# the demo embeds the seed scenario (include_str!)
COPY cloudstack-fixtures/scenarios ./cloudstack-fixtures/scenarios
RUN cargo build --release --locked --bin capc-health-shim \
 && cp target/release/capc-health-shim /capc-health-shim

FROM gcr.io/distroless/cc-debian12:nonroot
ARG CAPC_HEALTH_SHIM_COMMIT=unknown
LABEL org.opencontainers.image.source="https://github.com/capc-health-shim/capc-health-shim" \
      org.opencontainers.image.revision="${CAPC_HEALTH_SHIM_COMMIT}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /capc-health-shim /capc-health-shim
USER 65532:65532
# --status-addr's default: /status, /metrics (HTTPS), /healthz, /readyz
EXPOSE 8443
ENTRYPOINT ["/capc-health-shim"]
CMD ["run"]
