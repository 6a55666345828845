# Entry points: `make demo` runs the main job, `make test` the whole suite.
# Both install the Debian packages they need first (root on Debian 12).
BUILD ?= build
BUILD_TYPE ?= RelWithDebInfo
JOBS ?= $(shell nproc)

.PHONY: all deps build test demo clean

all: build

deps:
	bash scripts/install-deps.sh

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE)
	cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure --timeout 1200

demo: build
	$(BUILD)/src/tools/xagg demo

clean:
	rm -rf $(BUILD)
