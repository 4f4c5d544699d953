# capc-health-shim container image: `make image` (docker or podman; CONTAINER_ENGINE=podman).
# Build stage: the release binary. Runtime stage: distroless cc (glibc + libgcc, no shell),
# running as the non-root user 65532 — matches the Deployment's runAsNonRoot and
# readOnlyRootFilesystem (the shim writes no files).

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
# the allocator's build settings (jemalloc with one arena)
COPY .cargo ./.cargo
COPY src ./src
# the product's own crates
COPY crates/cloudstack-api ./crates/cloudstack-api
COPY crates/verdict ./crates/verdict
# the dev-only workspace members: their manifests only (cargo resolves the whole workspace's
# lock file; none of their code is compiled or copied)
COPY crates/cloudstack-sim/Cargo.toml ./crates/cloudstack-sim/Cargo.toml
COPY crates/test-support/Cargo.toml ./crates/test-support/Cargo.toml
# the demo embeds the seed scenario (include_str!)
COPY cloudstack-fixtures/scenarios ./cloudstack-fixtures/scenarios
RUN cargo build --release --locked --bin capc-health-shim \
 && cp target/release/capc-health-shim /capc-health-shim

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /capc-health-shim /capc-health-shim
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/capc-health-shim"]
CMD ["run"]
