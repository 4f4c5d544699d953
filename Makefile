# capc-health-shim — the two commands a newcomer needs are `make demo` and `make test`.

CARGO  ?= cargo
PYTHON ?= python3

.PHONY: all build demo test test-rust test-conformance bench lint fmt clean

all: build

build:
	$(CARGO) build --bins

## make demo: cloudstack-sim with the seed scenario + `capc-health-shim check` until the verdicts settle.
demo: build
	./target/debug/capc-health-shim demo

## make test: every test — Rust unit/integration/property tests and the `cs` (PyPI) conformance test.
test: test-rust test-conformance

test-rust:
	$(CARGO) test

test-conformance: build
	$(PYTHON) -m pytest -q tests/conformance

## make bench: benchmarks; writes target/bench/cloudstack.json
bench:
	$(CARGO) bench --bench cloudstack

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

clean:
	$(CARGO) clean
