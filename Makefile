# capc-health-shim — the two commands a newcomer needs are `make demo` and `make test`.

CARGO  ?= cargo
PYTHON ?= python3
GO     ?= go
APISERVER_PROFILE ?= capi-1.9
APISERVER_RUN := target/hack/apiserver-run
## Long builds print "still building <what>: 2m30s elapsed" every 30 s (hack/progress.sh).
PROGRESS := $(CURDIR)/hack/progress.sh
## Go builds resolve modules from go.mod (-mod=mod) and keep file paths out of the binaries and
## out of Go's build-cache keys (-trimpath), so the build cache also serves a build whose modules
## were downloaded into another module cache (CI downloads into a fresh one every run); the sources
## are still downloaded and checked against go.sum each time. GOFLAGS from the environment is kept
## (CI adds -modcacherw so its module cache can be deleted).
GO_BUILD_FLAGS := -mod=mod -trimpath $(GOFLAGS)
export GO_BUILD_FLAGS
## The Python packages of the conformance test live in a virtual environment of their own,
## made (and refreshed when the requirements change) by hack/venv.sh.
VENV := target/venv

.PHONY: all build demo demo-sim test test-build test-rust test-rust-build test-rust-run test-e2e-run test-conformance-run test-conformance venv test-e2e e2e-negative-control e2e-scorecard e2e-load e2e e2e-build e2e-build-114 bench timings lint fmt clean \
	apiserver apiserver-runner apiserver-build apiserver-smoke docs release image image-docker test-image test-image-run release-tool fuzz \
	release-manifests test-release test-monitoring promtool dist

all: build

build:
	$(PROGRESS) "the workspace binaries (cargo build)" $(CARGO) build --workspace --bins

## make demo: the whole stack locally (real kube-apiserver, real CAPI v1.9.6 + CAPC v0.6.1 controllers,
## cloudstack-sim, simulated workload clusters, the shim as a process) playing seed scenarios 1 and 3;
## prints the timeline and `capc-health-shim status`; exit 0 only if both clusters became ready.
## `make demo CAPC_E2E_CAPI=1.13` (or 1.14) plays it on CAPI v1.13.5 (v1.14.2) core in its own process,
## the shim in condition mode.
CAPC_E2E_CAPI ?= 1.9
export CAPC_E2E_CAPI
demo: build apiserver-build
	$(if $(filter 1.13,$(CAPC_E2E_CAPI)),$(MAKE) e2e-build)
	$(if $(filter 1.14,$(CAPC_E2E_CAPI)),$(MAKE) e2e-build-114)
	$(E2E_BUILD) "the demo (CAPI/CAPC Go modules)" $(GO) build -o $(CURDIR)/target/e2e/bin/demo ./cmd/demo
	cd tests/e2e && $(CURDIR)/target/e2e/bin/demo

## make demo-sim: the quick look without Kubernetes: cloudstack-sim's seed scenario + the `check` machinery
## (examples/demo.rs: a developer tool, not in the product binary).
demo-sim: build
	$(CARGO) run --quiet --example demo

## make test: every test — Rust unit/integration/property tests, the `cs` (PyPI) conformance test, and
## the end-to-end scenarios 1, 3 and 7 with their baselines and 8 (deletion races) (real CAPI + CAPC, see tests/e2e/README.md),
## the negative control (make e2e-negative-control) and the CloudStack load count (TestCloudStackLoad),
## hack/release's tests (make test-release), the alert unit tests (make test-monitoring) and the container image run from its own files (make test-image).
## Everything is built first (the image too); then two lanes run side by side (hack/lanes.sh), each with API servers
## of its own: the Rust tests, and the conformance + e2e tests. Both mostly wait on (scaled) timers,
## so together they take about as long as the longer one; each lane's output is prefixed with its
## name and kept in target/test-logs/. `make test-rust` / `make test-e2e` run one lane alone.
test: test-release test-monitoring test-build
	hack/lanes.sh rust '$(MAKE) --no-print-directory test-image-run test-rust-run' \
		e2e '$(MAKE) --no-print-directory test-conformance-run test-e2e-run'

## everything the two lanes run, built before they start (so no lane waits on the other's build),
## the container image included (the rust lane runs make test-image's checks first)
test-build: build apiserver-build e2e-build venv test-rust-build image dist

## The e2e harness is a Go module of its own (tests/e2e); Go fetches its modules from the proxy.
E2E_GO := cd tests/e2e && GOFLAGS="$(GO_BUILD_FLAGS)" GOWORK=off $(GO)
E2E_BUILD := cd tests/e2e && GOFLAGS="$(GO_BUILD_FLAGS)" GOWORK=off $(PROGRESS)
E2E_GO_113 := cd tests/e2e && CAPC_E2E_CAPI=1.13 GOFLAGS="$(GO_BUILD_FLAGS)" GOWORK=off $(GO)
E2E_GO_114 := cd tests/e2e && CAPC_E2E_CAPI=1.14 GOFLAGS="$(GO_BUILD_FLAGS)" GOWORK=off $(GO)
E2E_CI_SCENARIOS ?= TestManagement|TestScenario1WorkerNICDown|TestScenario3FirstControlPlaneNICDown|TestScenario7APIOutageAnd429|TestScenario8DeletionRaces|TestCloudStackLoad

## compile the e2e packages and test binaries once (cached by Go), so test time is test time;
## and process B of the CAPI v1.13 stack, CAPI core in a Go module of its own (tests/e2e/capi-core)
e2e-build:
	$(E2E_BUILD) "the e2e harness (CAPI/CAPC Go modules)" $(GO) build ./...
	$(E2E_BUILD) "the e2e test binaries" $(GO) test -count=1 -exec /bin/true ./... >/dev/null
	cd tests/e2e/capi-core && GOFLAGS="$(GO_BUILD_FLAGS)" GOWORK=off $(PROGRESS) "CAPI v1.13 core (tests/e2e/capi-core)" $(GO) build -o $(CURDIR)/target/e2e/bin/capi-core-v1.13 .

## process B for CAPI v1.14.2: the same source with -tags capi114 and its own pins (go.capi114.mod);
## make e2e and the v1.14 demo only (CI's make test runs v1.9 and v1.13)
e2e-build-114:
	cd tests/e2e/capi-core && GOFLAGS="$(GO_BUILD_FLAGS)" GOWORK=off $(PROGRESS) "CAPI v1.14 core (tests/e2e/capi-core)" $(GO) build -modfile=go.capi114.mod -tags capi114 -o $(CURDIR)/target/e2e/bin/capi-core-v1.14 .

## the CAPI v1.13 stack (CAPI core in its own process, condition mode): scenarios 1 and 8 in make test
E2E_CI_SCENARIOS_113 ?= TestManagement|TestScenario1WorkerNICDown|TestScenario8DeletionRaces

test-e2e: build apiserver-build e2e-build
	$(MAKE) --no-print-directory test-e2e-run

test-e2e-run:
	$(E2E_GO) test -count=1 -timeout 60m ./harness/ ./simapi/
	@# the v1.9 lane names its stack: an inherited CAPC_E2E_CAPI must not move it to another
	cd tests/e2e && CAPC_E2E_CAPI=1.9 GOFLAGS="$(GO_BUILD_FLAGS)" GOWORK=off $(GO) test -count=1 -timeout 60m -v -run '$(E2E_CI_SCENARIOS)' ./scenarios/
	$(call E2E_NEGATIVE_CONTROL,1.9)
	$(E2E_GO_113) test -count=1 -timeout 30m -v -run '$(E2E_CI_SCENARIOS_113)' ./scenarios/
	$(call E2E_NEGATIVE_CONTROL,1.13)

## the negative control (issues 27, 42): scenarios 1 and 3 with the shim unable to act (--mode
## observe) next to their baselines, once per stack: CAPI v1.9 (annotate mode) and v1.13 (condition
## mode, the muted rows with an MHC that does not list the condition). It passes only if each
## muted row is recycled by the MHC's backstop and fails causality and speed for that reason
## (harness.NegativeControlFailures). The stack is set here, never inherited, and the test never
## skips with CAPC_E2E_NEGATIVE_CONTROL=1. Its rows are added to target/e2e/report.json (mode
## shim-observe); on each stack it runs after that stack's scenarios, which drop the stack's rows.
E2E_NEGATIVE_CONTROL = cd tests/e2e && CAPC_E2E_CAPI=$(1) CAPC_E2E_NEGATIVE_CONTROL=1 CAPC_E2E_KEEP_ROWS=1 GOFLAGS="$(GO_BUILD_FLAGS)" GOWORK=off $(GO) test -count=1 -timeout 30m -v -run '^TestNegativeControl$$' ./scenarios/
e2e-negative-control: build apiserver-build e2e-build
	$(call E2E_NEGATIVE_CONTROL,1.9)
	$(call E2E_NEGATIVE_CONTROL,1.13)

## issue 44's e2e evidence on CAPI v1.9: scenarios 1, 3 and 5 with the shim observing their
## baselines in --mode observe (scenarios 1 and 3: its would-have-saved against what annotate mode
## saved in the same test, within 20 %; scenario 5: 0 false-alarm in the shim run, the slow VM the
## stock MHC recycled missed/healthy-with-traffic), then the negative control's muted rows (their
## would-have-saved); see tests/e2e/README.md "The scorecard". Rows go to target/e2e/report.json.
E2E_SCORECARD_SCENARIOS := TestScenario1WorkerNICDown|TestScenario3FirstControlPlaneNICDown|TestScenario5SlowButHealthy
e2e-scorecard: build apiserver-build e2e-build
	cd tests/e2e && CAPC_E2E_CAPI=1.9 GOFLAGS="$(GO_BUILD_FLAGS)" GOWORK=off $(GO) test -count=1 -timeout 30m -v -run '$(E2E_SCORECARD_SCENARIOS)' ./scenarios/
	$(call E2E_NEGATIVE_CONTROL,1.9)

## the CloudStack load per key (CAPC, shim, probe) of one healthy cluster alone on the simulator →
## target/e2e/cloudstack-load.json (make test runs it with the v1.9 scenarios; make bench reads it)
e2e-load: build apiserver-build e2e-build
	cd tests/e2e && CAPC_E2E_KEEP_ROWS=1 GOFLAGS="$(GO_BUILD_FLAGS)" GOWORK=off $(GO) test -count=1 -timeout 30m -v -run 'TestCloudStackLoad' ./scenarios/

## make e2e: every seed scenario with its baseline on every CAPI stack (v1.9 annotate mode, then
## v1.13 and v1.14 condition mode; about 25 min each); writes target/e2e/report.json and report.md
e2e: build apiserver-runner e2e-build e2e-build-114
	$(E2E_GO) test -count=1 -timeout 90m -v ./scenarios/
	$(E2E_GO_113) test -count=1 -timeout 90m -v ./scenarios/
	$(E2E_GO_114) test -count=1 -timeout 90m -v ./scenarios/

## The Rust tests of every workspace crate run with a real API server (CAPI 1.9 CRDs); the controller
## and deploy/ tests run again against the CAPI 1.13 CRDs (v1beta2 storage, unhealthyMachineConditions).
## Tests that need the API server are #[ignore = "needs a kube-apiserver …"], so a plain `cargo test`
## lists them as ignored; here they run (--include-ignored), except the measurements of `make timings`.
KUBE_TESTS := -- --include-ignored --skip measure_
test-rust: test-rust-build
	$(MAKE) --no-print-directory test-rust-run

test-rust-build: apiserver-build
	$(PROGRESS) "the Rust tests (cargo test --no-run)" $(CARGO) test --workspace --no-run

test-rust-run:
	@# controller_v1beta2_only's one test needs the capi-1.13-v1beta2-only profile (it fails elsewhere): run in the last pass
	hack/with-apiserver.sh capi-1.9 $(CARGO) test --workspace $(KUBE_TESTS) --skip condition_mode_without_one_v1beta1_request
	hack/with-apiserver.sh capi-1.13 $(CARGO) test --test controller_kube --test controller_probe --test controller_orphans --test controller_rbac --test controller_rows --test controller_faults --test controller_tenants --test controller_writer --test controller_budget --test writes_still_true --test alerts_kube --test fault_matrix --test run_binary --test deploy_manifests --test release_manifests --test operator_walk --test controller_coverage --test cleanup_kube --test controller_scorecard --test controller_incidents $(KUBE_TESTS)
	@# condition mode for every fault-matrix row but the two that time the remediate-machine annotation (annotate mode only; they fail here)
	hack/with-apiserver.sh capi-1.13 $(CARGO) test --test fault_matrix_kube $(KUBE_TESTS) --skip the_leader_killed_mid_escalation
	hack/with-apiserver.sh capi-1.13-v1beta2-only $(CARGO) test --test controller_v1beta2_only --test controller_kube --test controller_coverage --test controller_rbac --test run_binary $(KUBE_TESTS)

test-conformance: build venv
	$(MAKE) --no-print-directory test-conformance-run

test-conformance-run:
	$(VENV)/bin/python -m pytest -q tests/conformance

## the virtual environment of the conformance test: created on first use, packages re-installed
## only when tests/conformance/requirements.txt changes (a checksum in target/venv)
venv:
	PYTHON=$(PYTHON) hack/venv.sh $(VENV) tests/conformance/requirements.txt

## make bench: benchmarks (measurements, never tests); micro-benchmarks → target/bench/cloudstack.json,
## then scale and speed against per-Machine polling and the MHC timer (simulated time, about a minute)
## → target/bench/report.json and report.md (which include the micro-benchmarks)
bench: build apiserver-build e2e-build
	$(CARGO) bench --bench cloudstack
	@# section 1 (CloudStack load against CAPC) reads the calls counted per key in the e2e
	$(MAKE) e2e-load
	$(CARGO) bench --bench scale
	@# section 7 (issue 45): the incident finder over generated storms; merges into the report
	$(CARGO) bench -p verdict --bench incidents
	$(MAKE) apiserver-runner
	$(CARGO) bench --bench controller
## (part three, benches/controller/: the release `capc-health-shim run` as a process against a fresh real
## etcd + kube-apiserver per size holding 1 000 / 5 000 / 10 000 Machines: CPU s per poll cycle, peak RSS,
## settle time, API writes per steady cycle, /status latency → target/bench/controller.json, merged into
## report.json and section 4 of report.md; several minutes. It runs after `scale`, which rewrites the report.
## The steady fleet also in 10 scopes (one project per cluster) at 1 000 and 10 000 (CAPC_BENCH_SCOPED_SIZES):
## the controller's CloudStack calls per cycle in 1 and 10 scopes, beside CAPC's steady calls from
## target/e2e/cloudstack-load.json, make section 1b (shim per Machine-hour and ÷ CAPC at 1 000 / 10 000
## Machines; it fails when CAPC made no steady calls).
## CAPC_BENCH_BASELINE_SHIM=<older binary> measures that one too, same run: this ÷ baseline ratios.)

## make soak: issue 6 "Load", not part of `make bench` (~20 min): 10 000 Machines for an hour of simulated
## time (120 poll cycles at 3 s for 30 s) with the shim reaching the kube-apiserver through a latency-injecting
## TCP proxy, cloudstack-sim throttling (429) and slow, and 5 VMs Stopped/Error mid-way; RSS series, wrong or
## missed False verdicts → target/bench/soak.json, section 6 of report.md; exits 1 on a wrong or missed verdict.
## CAPC_SOAK_CYCLES / CAPC_SOAK_MACHINES shorten it.
## make bench-load: the scale report's CloudStack load sections alone (~1 min) → target/bench/load-only/;
## section 1 reads target/e2e/cloudstack-load.json (make e2e-load) and says so when it is missing
## make bench-incidents: section 7 alone (issue 45, ~1 min with its release build): precision and recall
## of the cause verdict::incidents names over generated storms, causes named for independent failures
## → target/bench/incidents.json, merged into report.json and report.md (CAPC_BENCH_INCIDENT_STORMS per kind)
.PHONY: bench-incidents
bench-incidents:
	$(CARGO) bench -p verdict --bench incidents

.PHONY: bench-load
bench-load:
	CAPC_BENCH_SCALE_ONLY=load $(CARGO) bench --bench scale

.PHONY: soak
soak: apiserver-runner
	CAPC_BENCH_CONTROLLER_PART=soak $(CARGO) bench --bench controller

## make apiserver: a real etcd + kube-apiserver on loopback with the CAPI/CAPC CRDs, in the foreground
## (Ctrl-C stops it). Ready when target/apiserver/kubeconfig exists. APISERVER_PROFILE=capi-1.13 for
## the CAPI v1.13 CRDs. First use builds the binaries (minutes); see hack/apiserver/README.md.
apiserver: apiserver-runner
	./$(APISERVER_RUN) --profile $(APISERVER_PROFILE) --dir target/apiserver

## the runner itself (small; rebuilt every time, go's build cache makes that instant)
apiserver-runner:
	cd hack/apiserver/run && GOFLAGS="$(GO_BUILD_FLAGS)" GOWORK=off $(PROGRESS) "the API server runner (hack/apiserver/run)" $(GO) build -o $(CURDIR)/$(APISERVER_RUN) .

## build (or find cached) etcd + kube-apiserver only
apiserver-build: apiserver-runner
	$(PROGRESS) "etcd and kube-apiserver (first use: minutes)" ./$(APISERVER_RUN) --build-only

## start, exercise with curl and stop the API server, for both profiles
apiserver-smoke: apiserver-runner
	hack/apiserver/smoke.sh capi-1.9
	hack/apiserver/smoke.sh capi-1.13

## make timings: fault → False → annotation times and CloudStack calls per cycle (measurements)
timings: apiserver-runner
	hack/with-apiserver.sh capi-1.9 $(CARGO) test --test controller_timings -- --ignored --nocapture --test-threads 1 measure_

## make docs: regenerate the flags table of docs/configuration.md (tests/docs_sync.rs checks it)
docs:
	CAPC_HEALTH_UPDATE_DOCS=1 $(CARGO) test --test docs_sync

## make release: optimised binaries, copied to target/release-artifacts/ (~7 min from cold here)
RELEASE_DIR := $(or $(CARGO_TARGET_DIR),target)/release
## Each binary on its own (--bin): a workspace build would unify the features of both binaries'
## dependencies, and the shim would then differ from the one make image builds and ships. The
## simulator's package is not among the default-run members, so it is named with -p.
RELEASE_SHIM_BUILD = $(CARGO) build --release --locked --bin capc-health-shim
release:
	$(RELEASE_SHIM_BUILD)
	$(CARGO) build --release --locked -p cloudstack-sim --bin cloudstack-sim
	mkdir -p target/release-artifacts
	cp $(RELEASE_DIR)/capc-health-shim $(RELEASE_DIR)/cloudstack-sim target/release-artifacts/
	cd target/release-artifacts && sha256sum capc-health-shim cloudstack-sim > SHA256SUMS

## make release-manifests: the release files, built from deploy/base by hack/release (a Go module of its
## own on kustomize's, clusterctl's and Helm's libraries; the same CAPI/Kubernetes module versions as
## tests/e2e/capi-core, so the module cache serves both): a clusterctl local repository
## target/release-manifests/addon-capc-health-shim/v<version>/ holding addon-components.yaml and
## metadata.yaml (the two assets a release publishes; not committed), and the Helm chart
## deploy/helm/capc-health-shim (committed; `make test` fails when it is not what deploy/base makes).
RELEASE_GO := cd hack/release && GOFLAGS="$(GO_BUILD_FLAGS)" GOWORK=off $(GO)
RELEASE_BUILD := cd hack/release && GOFLAGS="$(GO_BUILD_FLAGS)" GOWORK=off $(PROGRESS)
RELEASE_MANIFESTS := target/release-manifests
## With IMAGE=repository:tag it first runs make image and pins that reference to the digest of the
## image just built (target/image/digest): the components' default image and the chart's default
## values name repository:tag@sha256:…; that chart goes to target/release-manifests/chart/ (the
## committed one keeps the base's tag).
RELEASE_PIN = $(if $(IMAGE),--image $(IMAGE) --digest-file $(CURDIR)/$(IMAGE_DIR)/digest)
RELEASE_CHART_DIR = $(if $(IMAGE),$(CURDIR)/$(RELEASE_MANIFESTS)/chart/capc-health-shim,$(CURDIR)/deploy/helm/capc-health-shim)
release-manifests: release-tool $(if $(IMAGE),image)
	rm -rf $(RELEASE_MANIFESTS)
	./target/hack/release-tool manifests --root $(CURDIR) --out $(CURDIR)/$(RELEASE_MANIFESTS) $(RELEASE_PIN)
	./target/hack/release-tool chart --root $(CURDIR) --out $(RELEASE_CHART_DIR) $(RELEASE_PIN)

## make dist: the release bundle in target/dist/ — the image (OCI archive, digest, SBOM) of make image,
## addon-components.yaml + metadata.yaml and the Helm chart (capc-health-shim-<v>.tgz) pinned to the
## image's digest, the CLI binary, the version's CHANGELOG entry (refused without one), SHA256SUMS.
## IMAGE=registry/repo:tag names the image the files pin (default: deploy/base's).
DIST_DIR := target/dist
dist: image release-tool
	./target/hack/release-tool dist --root $(CURDIR) --image-dir $(CURDIR)/$(IMAGE_DIR) --out $(CURDIR)/$(DIST_DIR) $(if $(IMAGE),--image $(IMAGE))

## hack/release's Go tests, no API server (seconds; the first build downloads and compiles the modules,
## about a minute and a half): the components through clusterctl's library (defaults, variables,
## --target-namespace, metadata validation), the chart through Helm's (default and other values,
## schema, lint), the committed chart current. tests/release_manifests.rs (test-rust) applies both
## to the API server and runs the shim as their ServiceAccount.
test-release:
	$(RELEASE_BUILD) "hack/release's tests (kustomize, clusterctl, Helm modules)" $(GO) test -count=1 ./...

## make test-monitoring: deploy/components/monitoring checked with promtool, built from the Prometheus
## Go module (hack/monitoring, its own go.mod; the first build downloads and compiles it, several
## minutes): `promtool check rules` on the PrometheusRule's groups, `promtool test rules` (each alert
## fires on its trouble and stays silent on a benign series), and the metric names every rule and
## dashboard query names (PromQL parsed by Prometheus' parser) against hack/monitoring/testdata/
## queried-metrics.txt, which tests/monitoring_metrics.rs finds in the shim's /metrics, and the labels
## every alert selects on (`by`, `on`, matchers) against testdata/rule-labels.txt, which
## tests/monitoring_metrics.rs and tests/alerts_kube.rs find on the series of a scrape.
MONITORING_GO := cd hack/monitoring && GOFLAGS="$(GO_BUILD_FLAGS)" GOWORK=off $(GO)
MONITORING_BUILD := cd hack/monitoring && GOFLAGS="$(GO_BUILD_FLAGS)" GOWORK=off $(PROGRESS)
PROMTOOL := $(CURDIR)/target/tools/promtool
promtool:
	$(MONITORING_BUILD) "promtool (the Prometheus Go module, hack/monitoring)" $(GO) build -o $(PROMTOOL) github.com/prometheus/prometheus/cmd/promtool

test-monitoring: promtool
	$(MONITORING_GO) test -count=1 ./...

## make image: the container image, without a container daemon and without a base image
## (hack/release, go-containerregistry): the release binary, exactly the shared libraries it needs,
## a CA bundle and /etc/passwd, /etc/group for user 65532, as an OCI image layout in a tar →
## target/image/capc-health-shim-oci.tar, its manifest digest in target/image/digest and a CycloneDX
## SBOM in target/image/capc-health-shim.cdx.json. Reproducible: every time in it is the commit's.
## IMAGE=registry.example.com/capc-health-shim:v0.1.0 names it (default: the base's reference).
## make image-docker: the same from the Dockerfile, for those with docker or podman (CONTAINER_ENGINE=podman).
IMAGE ?=
IMAGE_DIR := target/image
image: release-tool
	$(PROGRESS) "the release binary (cargo build --release)" $(RELEASE_SHIM_BUILD)
	@# the image's binary, kept next to it (make test-image builds the image again from it)
	mkdir -p $(IMAGE_DIR) && cp $(RELEASE_DIR)/capc-health-shim $(IMAGE_DIR)/capc-health-shim
	./target/hack/release-tool image --root $(CURDIR) --binary $(IMAGE_DIR)/capc-health-shim --out $(CURDIR)/$(IMAGE_DIR) $(if $(IMAGE),--image $(IMAGE))

## make test-image: the image from its own filesystem (layers unpacked, run as 65532 on a read-only
## root, chroot in a mount namespace of its own: needs root): `--version`, `check` over TLS with and
## without a test CA in SSL_CERT_DIR, `run` ready against a test API server, no shell, its size
## → target/image/test-image.txt
test-image: image build apiserver-build
	$(MAKE) --no-print-directory test-image-run

test-image-run:
	APISERVER_TEST_DIR=target/apiserver-test-image hack/with-apiserver.sh capi-1.9 sh -c \
		'./target/hack/release-tool test-image --root $(CURDIR) --out $(CURDIR)/$(IMAGE_DIR) --binary $(IMAGE_DIR)/capc-health-shim --sim target/debug/cloudstack-sim --crane target/tools/crane --kubeconfig "$$CAPC_HEALTH_TEST_KUBECONFIG"'

CONTAINER_ENGINE ?= docker
image-docker:
	$(CONTAINER_ENGINE) build --build-arg CAPC_HEALTH_SHIM_COMMIT=$$(git rev-parse HEAD) -t $(or $(IMAGE),capc-health-shim:dev) .

## the release tool itself (hack/release), and crane from the same module graph (make test-image pushes with it)
release-tool:
	$(RELEASE_BUILD) "hack/release (kustomize, clusterctl, Helm, go-containerregistry modules)" $(GO) build -o $(CURDIR)/target/hack/release-tool .
	$(RELEASE_GO) build -o $(CURDIR)/target/tools/crane github.com/google/go-containerregistry/cmd/crane

## make fuzz: the five fuzz targets of fuzz/ (parser, error envelope, signer, scenario loader,
## condition upsert), FUZZ_SECONDS each (default 20), on the stable toolchain (`cargo fuzz -s none`,
## cargo-fuzz from crates.io on first use); seeds from the fixtures into target/fuzz-corpus/;
## writes target/fuzz/report.json; fails when a target crashes (input in target/fuzz/artifacts/).
## cargo-fuzz is installed into target/tools (pinned, from crates.io) on first use: never taken
## from the PATH, so a copy someone installed by hand cannot hide the install step.
FUZZ_SECONDS ?= 20
CARGO_FUZZ_VERSION := 0.13.1
FUZZ_TOOLS := $(CURDIR)/target/tools
fuzz:
	@test -x $(FUZZ_TOOLS)/bin/cargo-fuzz || $(PROGRESS) "cargo-fuzz $(CARGO_FUZZ_VERSION) (cargo install, first use)" \
		$(CARGO) install --locked --quiet --root $(FUZZ_TOOLS) --version $(CARGO_FUZZ_VERSION) cargo-fuzz
	PATH="$(FUZZ_TOOLS)/bin:$$PATH" FUZZ_SECONDS=$(FUZZ_SECONDS) $(PYTHON) fuzz/run.py

lint:
	@# every -run alternative, --skip, cargo test filter and --test target here selects a test
	$(PYTHON) hack/check-test-patterns.py
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	@# the pure crates alone, as the fuzz targets build them (the workspace build unifies `client` in)
	$(CARGO) clippy -p capi-model -p cloudstack-api -p verdict --all-targets -- -D warnings
	@test -z "$$(cd tests/e2e && gofmt -l .)" || { echo "gofmt needed in tests/e2e:"; cd tests/e2e && gofmt -l .; exit 1; }
	$(E2E_GO) vet ./...
	@test -z "$$(cd hack/release && gofmt -l .)" || { echo "gofmt needed in hack/release:"; cd hack/release && gofmt -l .; exit 1; }
	$(RELEASE_GO) vet ./...
	@test -z "$$(cd hack/monitoring && gofmt -l .)" || { echo "gofmt needed in hack/monitoring:"; cd hack/monitoring && gofmt -l .; exit 1; }
	$(MONITORING_GO) vet ./...

fmt:
	$(CARGO) fmt --all

clean:
	$(CARGO) clean
