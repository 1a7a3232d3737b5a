# datamount: set-up, tests, lint and demo. Every target installs what it needs
# on a fresh Debian machine with Python 3.11 (venv, pip, npm for Azurite,
# fuse3 through apt-get when fusermount3 is missing).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
NODE_STAMP := node_modules/.installed
PYTEST_ARGS ?=

.PHONY: setup test test-fast docs docs-check lint demo asan bench bench-deps posix clean system-deps image image-deps image-test

setup: system-deps $(STAMP) $(NODE_STAMP)

# System packages: fusermount3 (FUSE mounts), npm (Azurite), python3-venv, and
# what pip needs to build the native FUSE loop from source (gcc, libfuse3-dev,
# libxxhash-dev, libssl-dev for the native GET, Python's headers).
system-deps:
	@missing=""; \
	command -v fusermount3 >/dev/null 2>&1 || missing="$$missing fuse3"; \
	command -v gcc >/dev/null 2>&1 || missing="$$missing gcc"; \
	[ -f /usr/include/fuse3/fuse_lowlevel.h ] || missing="$$missing libfuse3-dev"; \
	[ -f /usr/include/xxhash.h ] || missing="$$missing libxxhash-dev"; \
	[ -f /usr/include/openssl/ssl.h ] || missing="$$missing libssl-dev"; \
	$(PYTHON) -c "import os, sysconfig; assert os.path.exists(sysconfig.get_paths()['include'] + '/Python.h')" \
		>/dev/null 2>&1 || missing="$$missing python3-dev"; \
	command -v npm >/dev/null 2>&1 || missing="$$missing nodejs npm"; \
	$(PYTHON) -c "import venv, ensurepip" >/dev/null 2>&1 || missing="$$missing python3-venv"; \
	if [ -n "$$missing" ]; then \
		echo "installing system packages:$$missing"; \
		if [ "$$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi

$(STAMP): pyproject.toml setup.py src/datamount/fs/_lowlevel.c src/datamount/read/_buffers.c \
		src/datamount/storage/_httpget.c
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

# Everything (CI): the generated pages checked and the site built strictly,
# then every test tier.
test: setup docs-check
	$(BIN)/pytest --durations=25 $(PYTEST_ARGS)

# The unit tier only: logic, no emulator, no FUSE, no oracle (under a minute).
test-fast: setup
	$(BIN)/pytest -m unit -q $(PYTEST_ARGS)

# The docs site (docs/, mkdocs.yml): reference pages generated from the code,
# then built strictly (a broken link or a page left out of the nav fails).
# docs-check (what `make test` runs) fails on a generated page that is stale.
docs: setup
	$(BIN)/python scripts/gendocs.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir .site

docs-check: setup
	$(BIN)/python scripts/gendocs.py --check
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir .site

lint: setup
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/ruff format --check src tests benchmarks scripts
	$(BIN)/mypy
	$(BIN)/lint-imports

demo: setup
	$(BIN)/python scripts/demo.py

# The POSIX suite (pjdfstest, from the source tree PJDFSTEST_SRC names, built
# with autotools)
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

# The FUSE tests and the raw path's GET tests with the native code built with
# AddressSanitizer (every Python process preloads libasan; CPython's own leaks
# are not reported), then the plain build back in place, whatever the result.
# Left out: the mount in a 360 MiB memory cgroup (ASan's shadow memory and
# quarantine alone exceed it).
ASAN_TESTS := tests/test_native_get.py tests/test_storage_azure_raw.py
asan: setup
	DATAMOUNT_ASAN=1 $(BIN)/python setup.py -q build_ext --inplace --force
	export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 LD_PRELOAD=$$(gcc -print-file-name=libasan.so); \
	$(BIN)/pytest -q -p no:cacheprovider $(ASAN_TESTS) $(PYTEST_ARGS) && \
		$(BIN)/pytest -m fuse -q -p no:cacheprovider -k 'not small_memory_cgroup' \
		$(PYTEST_ARGS); status=$$?; \
	$(BIN)/python setup.py -q build_ext --inplace --force; exit $$status

bench: setup bench-deps
	$(BIN)/python benchmarks/_gil.py calibrate  # the GIL-share method: spinner ~1, sleeper ~0
	$(BIN)/python benchmarks/transfer.py
	$(BIN)/python benchmarks/mount.py
	for ms in 5 20; do $(BIN)/python benchmarks/mount.py --datasets B --no-fsspec \
		--workloads 7,8,9,13,14,15 --delay-ms $$ms || exit 1; done  # a cloud store's latency
	$(BIN)/python benchmarks/mltable.py

# The container image (docker/Containerfile) built with podman, rootful.
# Settings found to work on this machine kind (a VM without systemd, cgroup v1
# with a v2 hierarchy beside it): crun refuses hybrid cgroups, so runc;
# cgroupfs (no systemd); a file events log (no journald); the overlay storage
# driver works natively. podman's default ulimits (nofile 1048576) exceed the
# host's hard limits here and setrlimit fails, so the container gets the
# host's nofile and a fixed nproc. BASE_IMAGE=debian:bookworm-slim with
# registry access; the default is a base made locally with debootstrap
# (docker/base_image.sh), cached in IMAGE_CACHE and in podman's storage.
# BUILD_CA: the CA bundle pip trusts in the build (a TLS-intercepting proxy's
# CA is in the host's bundle); empty: pip's own.
IMAGE       ?= localhost/datamount:latest
LOCAL_BASE  := localhost/datamount-base:bookworm
BASE_IMAGE  ?= $(LOCAL_BASE)
IMAGE_CACHE ?= $(HOME)/.cache/datamount-image
BUILD_CA    ?= $(wildcard /etc/ssl/certs/ca-certificates.crt)
PODMAN      ?= podman --runtime runc --cgroup-manager cgroupfs --events-backend file
NOFILE      := $(shell ulimit -Hn)
PODMAN_ULIMITS ?= --ulimit nofile=$(NOFILE):$(NOFILE) --ulimit nproc=32768:32768
IMAGE_TEST_ARGS ?=
export PODMAN PODMAN_ULIMITS

image-deps:
	@missing=""; \
	command -v podman >/dev/null 2>&1 || missing="$$missing podman"; \
	command -v runc >/dev/null 2>&1 || missing="$$missing runc"; \
	if [ -n "$$missing" ]; then \
		echo "installing system packages:$$missing"; \
		if [ "$$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi
	@if [ "$(BASE_IMAGE)" = "$(LOCAL_BASE)" ]; then docker/base_image.sh $(LOCAL_BASE) $(IMAGE_CACHE); fi

image: image-deps
	$(PODMAN) build $(PODMAN_ULIMITS) -f docker/Containerfile --build-arg BASE=$(BASE_IMAGE) \
		$(if $(BUILD_CA),-v $(BUILD_CA):/run/build-ca.crt:ro --build-arg PIP_CERT=/run/build-ca.crt) \
		-t $(IMAGE) .
	@$(PODMAN) image inspect $(IMAGE) --format '$(IMAGE): {{.Size}} bytes'

# Runs the image for real (FUSE in the container, Azurite on the host's
# loopback, the host reading through an rshared bind mount, SIGTERM draining),
# then the pod of docker/k8s under `podman kube play`. Minutes; not in `make test`.
image-test: setup image
	$(BIN)/python scripts/image_test.py --image $(IMAGE) $(IMAGE_TEST_ARGS)

# Each verdict of the mount diagnosis provoked by a mount set up for it (~5 min).
.PHONY: bench-diagnose
bench-diagnose: setup
	$(BIN)/python benchmarks/diagnose.py $(DIAGNOSE_ARGS)

clean:
	rm -rf $(VENV) node_modules .pytest_cache .mypy_cache .ruff_cache .demo .site
