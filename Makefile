# agent-sandbox: build, test and lint. `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

CARGO ?= cargo
# Podman settings for the Debian 12 test machines (runc, explicit ulimits); harmless elsewhere.
export CONTAINERS_CONF ?= $(CURDIR)/tests/containers.conf

.PHONY: help build test lint fmt

help: ## list the targets
	@grep -hE '^[a-z][a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 20

build: ## build the release binaries
	$(CARGO) build --release --workspace --locked

test: ## everything the project tests
	$(CARGO) test --workspace --locked

lint: ## rustfmt --check and clippy -D warnings
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

fmt: ## format the code
	$(CARGO) fmt --all
