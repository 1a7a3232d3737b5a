# datamount: set-up, tests, lint and demo. Every target installs what it needs
# on a fresh Debian machine with Python 3.11 (venv, pip, npm for Azurite,
# fuse3 through apt-get when fusermount3 is missing).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
NODE_STAMP := node_modules/.installed
PYTEST_ARGS ?=

.PHONY: setup test lint demo bench bench-deps posix clean system-deps

setup: system-deps $(STAMP) $(NODE_STAMP)

# System packages: fusermount3 (FUSE mounts), npm (Azurite), python3-venv.
system-deps:
	@missing=""; \
	command -v fusermount3 >/dev/null 2>&1 || missing="$$missing fuse3"; \
	command -v npm >/dev/null 2>&1 || missing="$$missing nodejs npm"; \
	$(PYTHON) -c "import venv, ensurepip" >/dev/null 2>&1 || missing="$$missing python3-venv"; \
	if [ -n "$$missing" ]; then \
		echo "installing system packages:$$missing"; \
		if [ "$$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $@

# The mount benchmark's baseline, fsspec's own FUSE, needs fusepy on libfuse2.
bench-deps: setup
	@ldconfig -p | grep -q 'libfuse\.so\.2 ' || { \
		echo "installing system packages: libfuse2"; \
		if [ "$$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
			$$SUDO apt-get install -y -qq libfuse2t64 2>/dev/null || \
			$$SUDO apt-get install -y -qq libfuse2; }
	$(BIN)/pip install -q -e '.[test,bench]'

$(NODE_STAMP): package.json
	npm install --no-audit --no-fund --loglevel=error
	touch $@

test: setup
	$(BIN)/pytest $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/ruff format --check src tests benchmarks scripts
	$(BIN)/mypy
	$(BIN)/lint-imports

demo: setup
	$(BIN)/python scripts/demo.py

# The POSIX suite (pjdfstest from ../shared/pjdfstest, built with autotools)
# from inside an rw_mount and a ro_mount, beside the previous run's figures.
# Minutes long, nothing asserted: not part of `make test`. POSIX_ARGS: e.g.
# POSIX_ARGS="--only unlink,rename --modes rw_mount".
POSIX_ARGS ?=
posix: setup
	@command -v autoreconf >/dev/null 2>&1 && command -v automake >/dev/null 2>&1 || { \
		echo "installing system packages: autoconf automake"; \
		if [ "$$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
			$$SUDO apt-get install -y -qq autoconf automake; }
	$(BIN)/python scripts/posix.py $(POSIX_ARGS)

bench: setup bench-deps
	$(BIN)/python benchmarks/transfer.py
	$(BIN)/python benchmarks/mount.py
	$(BIN)/python benchmarks/mltable.py

# Each verdict of the mount diagnosis provoked by a mount set up for it (~5 min).
.PHONY: bench-diagnose
bench-diagnose: setup
	$(BIN)/python benchmarks/diagnose.py $(DIAGNOSE_ARGS)

clean:
	rm -rf $(VENV) node_modules .pytest_cache .mypy_cache .ruff_cache .demo
