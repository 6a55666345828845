#!/usr/bin/env bash
# Installs the build into a temporary DESTDIR and uses what it installed (tests/install/CMakeLists.txt
# sets the environment: BUILD_DIR, CONSUMER_DIR and the install directories, PREFIX, BINDIR, ...).
set -euo pipefail

fail() {
  echo "install test FAILED: $*" >&2
  exit 1
}
# Runs a command quietly; on failure shows its output and fails with the message.
run() {
  local message=$1
  shift
  "$@" >"$tmp/output" 2>&1 || { cat "$tmp/output" >&2; fail "$message"; }
}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/xagg-install-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
root=$tmp/root  # the DESTDIR: the installed tree's paths are those of PREFIX inside it

run "cmake --install $BUILD_DIR into DESTDIR $root" env DESTDIR="$root" cmake --install "$BUILD_DIR"

# Only the public headers are installed.
headers=$(cd "$root$INCLUDEDIR" && find . -type f | sort | tr '\n' ' ')
[ "$headers" = "./xagg/communicator.h ./xagg/errors.h ./xagg/quantize.h ./xagg/secret.h " ] ||
  fail "installed headers under $INCLUDEDIR are '$headers', not exactly xagg/{communicator,errors,quantize,secret}.h"

# A separate CMake project: find_package(xagg) + xagg::xagg.
run "configuring $CONSUMER_DIR with find_package(xagg) from the installed tree" \
  cmake -S "$CONSUMER_DIR" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$root$PREFIX" -DCMAKE_BUILD_TYPE=Release
found=$(sed -n 's/^xagg_DIR:PATH=//p' "$tmp/consumer/CMakeCache.txt")
[[ $found == "$root"/* ]] || fail "find_package(xagg) found $found, not the package in the installed tree"
run "building the consumer project against the installed xagg::xagg" cmake --build "$tmp/consumer"
run "the consumer program built with CMake" "$tmp/consumer/consumer"

# The same program with pkg-config; the sysroot puts the .pc file's paths inside the DESTDIR.
export PKG_CONFIG_PATH=$root$LIBDIR/pkgconfig PKG_CONFIG_SYSROOT_DIR=$root
flags=$(pkg-config --cflags --libs xagg) || fail "pkg-config --cflags --libs xagg (PKG_CONFIG_PATH=$PKG_CONFIG_PATH)"
# shellcheck disable=SC2086 # flags are words
run "building the consumer program with: pkg-config --cflags --libs xagg: $flags" \
  g++ -std=c++20 "$CONSUMER_DIR/main.cpp" $flags -o "$tmp/consumer-pkg-config"
run "the consumer program built with pkg-config" "$tmp/consumer-pkg-config"

# The command, and its configuration file as the unit passes it.
xagg=$root$BINDIR/xagg
run "$xagg --help" "$xagg" --help
unit=$(find "$root" -name xagg-aggregator.service)
[ -f "$unit" ] || fail "no (single) xagg-aggregator.service installed: '$unit'"
exec_start=$(sed -n 's/^ExecStart=//p' "$unit")
[[ $exec_start == "$BINDIR/xagg aggregator --config "* ]] ||
  fail "$unit: ExecStart=$exec_start does not run the installed $BINDIR/xagg aggregator --config"
config=$root${exec_start##* --config }
[ -f "$config" ] || fail "$unit: the configuration file it names is not installed: $config"
# Every option the example shows, uncommented, is one xagg aggregator knows (--help: parse, do not run).
sed 's/^#\([a-z-]* = \)/\1/' "$config" >"$tmp/all-options.conf"
run "$xagg aggregator --config (the installed example, every option uncommented) refused it" \
  "$xagg" aggregator --config "$tmp/all-options.conf" --help
printf 'interface = eth0\nmemory-qouta = 1024\n' >"$tmp/typo.conf"
if "$xagg" aggregator --config "$tmp/typo.conf" --help >"$tmp/output" 2>&1; then
  fail "xagg aggregator --config accepted the unknown key memory-qouta"
fi
grep -q "memory-qouta" "$tmp/output" || fail "the refusal of key memory-qouta does not name it: $(cat "$tmp/output")"
printf 'interface = eth0\nmetrics = 127.0.0.1.1\n' >"$tmp/bad-value.conf"
if "$xagg" aggregator --config "$tmp/bad-value.conf" --help >"$tmp/output" 2>&1; then
  fail "xagg aggregator --config did not check the file's values (metrics = 127.0.0.1.1 accepted)"
fi

# The unit and the user it runs as.
sysusers=$(find "$root" -path '*/sysusers.d/xagg.conf')
grep -q '^u xagg ' "$sysusers" || fail "no sysusers.d/xagg.conf creating user xagg: '$sysusers'"
if command -v systemd-analyze >/dev/null && command -v systemd-sysusers >/dev/null; then
  # A copy whose ExecStart and ExecStartPre run the installed xagg inside DESTDIR, which verify
  # requires to exist.
  mkdir "$tmp/unit"
  sed -E "s#^(ExecStart(Pre)?=\+?)$BINDIR/#\1$root$BINDIR/#" "$unit" >"$tmp/unit/xagg-aggregator.service"
  run "systemd-analyze verify $unit" systemd-analyze verify --man=no "$tmp/unit/xagg-aggregator.service"
  run "systemd-sysusers --dry-run $sysusers" systemd-sysusers --root="$tmp/unit" --dry-run "$sysusers"
else
  echo "install test: no systemd-analyze or systemd-sysusers: the unit is checked for its ExecStart only" >&2
fi

# The scripts users run: Debian's python3 (it has matplotlib), executable.
for script in plot_throughput.py plot_hetero.py model_traces.py plot_training.py; do
  path=$root$SCRIPTS_DIR/$script
  [ -f "$path" ] || fail "$SCRIPTS_DIR/$script is not installed"
  [ -x "$path" ] || fail "$SCRIPTS_DIR/$script is not executable"
  [ "$(head -n 1 "$path")" = "#!/usr/bin/python3" ] || fail "$SCRIPTS_DIR/$script: first line is not #!/usr/bin/python3"
done

# xagg_torch imports from where Debian's python3 looks for it.
run "import xagg_torch from $PYTHON_DIR" env PYTHONPATH="$root$PYTHON_DIR" /usr/bin/python3 -c \
  "import sys, xagg_torch; sys.exit(not xagg_torch.__file__.startswith('$root'))"

echo "install test: ok"
