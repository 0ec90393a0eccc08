# agent-sandbox: build, test and lint. `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

CARGO ?= cargo
# Podman settings for the Debian 12 test machines (runc, explicit ulimits); harmless elsewhere.
export CONTAINERS_CONF ?= $(CURDIR)/tests/containers.conf

# The router image (router + forwarder, static, FROM scratch); containers/router/build.sh makes it.
ROUTER_IMAGE ?= localhost/agent-sandbox-router:dev
STATIC_FORWARDER := target/x86_64-unknown-linux-gnu/release-small/agent-sandbox-forwarder

.PHONY: help build test lint fmt router-image image-test bench-forwarder

help: ## list the targets
	@grep -hE '^[a-z][a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 20

build: router-image ## build the release binaries and the router image
	$(CARGO) build --release --workspace --locked

test: ## everything the project tests
	$(CARGO) test --workspace --locked
	$(MAKE) --no-print-directory image-test

lint: ## rustfmt --check and clippy -D warnings
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings
	shellcheck containers/router/build.sh

fmt: ## format the code
	$(CARGO) fmt --all

router-image: ## the router image (ROUTER_IMAGE=localhost/agent-sandbox-router:dev) with podman
	CARGO=$(CARGO) containers/router/build.sh $(ROUTER_IMAGE)

image-test: router-image ## run the router and the forwarder from the image (rootful podman)
	AGENT_SANDBOX_ROUTER_IMAGE=$(ROUTER_IMAGE) $(CARGO) test --locked -p agent-sandbox-forwarder --test image -- --ignored

bench-forwarder: ## the shipped forwarder vs socat on loopback: connections/s, MB/s (about 25 s)
	CARGO=$(CARGO) containers/router/build.sh --binaries-only
	FORWARDER_BIN=$(CURDIR)/$(STATIC_FORWARDER) $(CARGO) bench --locked -p agent-sandbox-forwarder --bench relay
