# Entry points: `make demo` runs the main job, `make test` the whole suite,
# `make install` installs (docs/operations.md). They install the Debian packages
# they need first (root on Debian 12).
BUILD ?= build
BUILD_TYPE ?= RelWithDebInfo
JOBS ?= $(shell nproc)
# The build records the prefix (the unit's ExecStart, xagg.pc): install with the same one.
PREFIX ?= /usr/local

.PHONY: all deps build test demo install clean

all: build

deps:
	bash scripts/install-deps.sh

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DCMAKE_INSTALL_PREFIX=$(PREFIX)
	cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure --timeout 1200

demo: build
	$(BUILD)/src/tools/xagg demo

# DESTDIR=/staging stages the tree, for packaging.
install: build
	DESTDIR=$(DESTDIR) cmake --install $(BUILD)

clean:
	rm -rf $(BUILD)
