#!/usr/bin/env bash
# Soak test (not in CI): one hour, 4 workers, 1% random loss on every link,
# one worker killed with SIGKILL every 3 minutes and its job restarted.
# Prints all-reduces, wrong results (must be 0), timeouts and the aggregator's
# memory (resident and BPF maps) at start and end; exits 1 on a wrong result,
# an unexplained worker failure or an aggregator death.
#
#   sudo scripts/soak.sh                       # the full hour
#   sudo scripts/soak.sh --duration-s 600 --kill-every-s 60 --loss 0.05
#
# Extra arguments go to the driver (tests/reliability/soak.cpp); see --help.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}

if [[ $(id -u) -ne 0 ]]; then
  echo "soak.sh: needs root (namespaces, XDP, tc programs)" >&2
  exit 1
fi
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD_DIR" --target reliability_soak xagg -j "$(nproc)"
exec "$BUILD_DIR/tests/reliability/reliability_soak" --duration-s 3600 --workers 4 --loss 0.01 --kill-every-s 180 "$@"
