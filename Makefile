# agent-sandbox: build, test and lint. `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

CARGO ?= cargo
# Podman settings for the Debian 12 test machines (runc, explicit ulimits); harmless elsewhere.
export CONTAINERS_CONF ?= $(CURDIR)/tests/containers.conf

# The router image (router + forwarder, static, FROM scratch); containers/router/build.sh makes it.
ROUTER_IMAGE ?= localhost/agent-sandbox-router:dev
STATIC_FORWARDER := target/x86_64-unknown-linux-gnu/release-small/agent-sandbox-forwarder

# The sandbox image's Debian base: the Containerfile's public default, unless a local one made by
# `make base-image` exists (machines with no registry, like the test machines).
LOCAL_BASE := localhost/debian:bookworm
SANDBOX_BASE ?= $(shell podman image exists $(LOCAL_BASE) 2>/dev/null && echo $(LOCAL_BASE))

.PHONY: help build test lint fmt router-image image-test bench-forwarder base-image e2e

help: ## list the targets
	@grep -hE '^[a-z][a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 20

build: ## build the release binaries and both images (agent-sandbox --build-images)
	$(CARGO) build --release --workspace --locked
	target/release/agent-sandbox --build-images $(if $(SANDBOX_BASE),--base-image $(SANDBOX_BASE))

test: ## everything the project tests
	$(CARGO) test --workspace --locked
	$(MAKE) --no-print-directory image-test
	$(MAKE) --no-print-directory e2e

lint: ## rustfmt --check and clippy -D warnings
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings
	shellcheck containers/router/build.sh tests/e2e/make-base.sh

fmt: ## format the code
	$(CARGO) fmt --all

router-image: ## the router image (ROUTER_IMAGE=localhost/agent-sandbox-router:dev) with podman
	$(CARGO) build --release --locked -p agent-sandbox
	AGENT_SANDBOX_ROUTER_IMAGE=$(ROUTER_IMAGE) target/release/agent-sandbox --build-images=router

image-test: router-image ## run the router and the forwarder from the image (rootful podman)
	AGENT_SANDBOX_ROUTER_IMAGE=$(ROUTER_IMAGE) $(CARGO) test --locked -p agent-sandbox-forwarder --test image -- --ignored

bench-forwarder: ## the shipped forwarder vs socat on loopback: connections/s, MB/s (about 25 s)
	CARGO=$(CARGO) containers/router/build.sh --binaries-only
	FORWARDER_BIN=$(CURDIR)/$(STATIC_FORWARDER) $(CARGO) bench --locked -p agent-sandbox-forwarder --bench relay

base-image: ## a local Debian base for the sandbox image, with debootstrap (root; no registry needed)
	tests/e2e/make-base.sh $(LOCAL_BASE)

e2e: ## end-to-end suite: real launcher, podman and images; rootful and rootless (as root)
	$(if $(SANDBOX_BASE),,tests/e2e/make-base.sh $(LOCAL_BASE))
	$(MAKE) --no-print-directory build SANDBOX_BASE=$(or $(SANDBOX_BASE),$(LOCAL_BASE))
	AGENT_SANDBOX_E2E=1 $(CARGO) test --locked -p agent-sandbox --test e2e -- --nocapture
