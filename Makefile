# Entry points for a fresh machine: `make demo` runs the main job, `make test` the whole
# suite, `make install` installs (docs/operations.md). They install the Debian packages
# they need first (root on Debian 12). `make build` and `make check` (the tests that need
# no root, under a minute) install nothing: for a machine that has the packages.
BUILD ?= build
BUILD_TYPE ?= RelWithDebInfo
JOBS ?= $(shell nproc)
# The build records the prefix (the unit's ExecStart, xagg.pc): install with the same one.
PREFIX ?= /usr/local

.PHONY: all deps build check test demo install clean

all: build

deps:
	bash scripts/install-deps.sh

build:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DCMAKE_INSTALL_PREFIX=$(PREFIX)
	cmake --build $(BUILD) -j $(JOBS)

check: build
	cd $(BUILD) && ctest --output-on-failure --label-regex noroot --timeout 120

# The packages first, then the build: a sub-make keeps that order under `make -j`.
test: deps
	$(MAKE) build
	cd $(BUILD) && ctest --output-on-failure --timeout 1200

demo: deps
	$(MAKE) build
	$(BUILD)/src/tools/xagg demo

# DESTDIR=/staging stages the tree, for packaging.
install: deps
	$(MAKE) build
	DESTDIR=$(DESTDIR) cmake --install $(BUILD)

clean:
	rm -rf $(BUILD)
