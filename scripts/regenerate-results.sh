#!/usr/bin/env bash
# Reruns the measurements behind docs/results/ and rewrites each file's measured block
# (between its `<!-- measured: NAME -->` and `<!-- end measured -->` lines) with the
# command's output, the date, the protocol version and the CPU it ran on. The text around
# the block (what is measured and how) stays.
#
#   scripts/regenerate-results.sh [--build DIR] [--list] [NAME...]   # default: every NAME
#
# Needs root (namespaces, XDP) and a build (`make build`). Each NAME runs its own testbeds one
# after another and removes them; the longest (training, hetero) take an hour or more on
# 2 cores. A command that fails leaves its file as it was and makes the script exit 1.
set -euo pipefail

cd "$(dirname "$0")/.."
build=build
names=()
while (($#)); do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --list) list=1; shift ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    -*) echo "regenerate-results: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) names+=("$1"); shift ;;
  esac
done

xagg="$build/src/tools/xagg"
export MALLOC_MMAP_THRESHOLD_=1000000000 MALLOC_TRIM_THRESHOLD_=1000000000  # docs/training.md

# NAME -> the commands whose output is its measured block (one shell snippet each).
declare -A commands=(
  [throughput]="$xagg bench throughput --workers 4 --sizes 4M,64M --iterations 5"
  [capacity]="chrt -f 1 $xagg bench capacity --seconds 3"
  [mtu]="$xagg bench throughput --mtus 1500,4000,9000 --workers 4 --sizes 4M,64M --iterations 5 --systems xagg-xdp
$build/tests/e2e/e2e_tests --gtest_filter='CellMemoryTest.*' | grep '^reserved'"
  [result-modes]="for layout in 'routed --results unicast' 'routed --results multicast' '1 --results broadcast' '1 --results unicast'; do
  $xagg bench throughput --workers 4 --aggregators \$layout --sizes 16M,64M --iterations 5 --systems xagg-xdp; done"
  [reduce-scatter]="$build/tests/pytorch/collectives_tests 2>&1 | grep 'reduce_scatter_tensor received'"
  [two-level]="$xagg bench throughput --workers 9 --aggregators 1,two-level:3 --sizes 4M,16M --systems xagg-xdp,tcp-ps --iterations 5
$xagg bench throughput --workers 9 --aggregators 1,two-level:3 --sizes 16M --systems xagg-xdp,tcp-ps --iterations 4 --link-gbit 1
for layout in 1 two-level:2 two-level:4; do
  $xagg bench hetero --scenario scenarios/equal-links-8.json --aggregators \$layout --systems xagg,tcp-ps --iterations 6; done"
  [scale-out]="$xagg bench throughput --workers 4 --aggregators 1,2,4,colocated --link-gbit 1 --sizes 64M --systems xagg-xdp,tcp-ps,gloo --iterations 3
for n in 4 8; do for layout in 1 \$n colocated; do
  $xagg bench hetero --scenario scenarios/equal-links-\$n.json --aggregators \$layout --iterations 11 --systems xagg,tcp-ps,gloo; done; done"
  [congestion]="for s in equal-links-4 equal-links-4-competing-aggregator; do
  $xagg bench hetero --scenario scenarios/\$s.json --aggregators 1 --systems xagg,tcp-ps --iterations 11; done
$xagg bench hetero --scenario scenarios/equal-links-4-competing-aggregator.json --systems xagg,tcp-ps --iterations 11"
  [hetero]="for s in homogeneous stragglers compute-heterogeneous bandwidth-heterogeneous both both-anticorrelated \\
    bandwidth-heterogeneous-fast both-fast both-anticorrelated-fast compute-heterogeneous-bert compute-heterogeneous-vgg16; do
  $xagg bench hetero --scenario scenarios/\$s.json --iterations 11 --rounds 3; done"
  [training]="logs=\$(mktemp -d)
for s in homogeneous compute-heterogeneous bandwidth-heterogeneous both equal-links-4 two-level-8; do
  for b in xagg tcp-ps gloo; do
    $xagg train --model mlp --scenario scenarios/\$s.json --backend \$b --train-samples 6400 --test-samples 2000 \\
        --eval-every 10 --log \$logs/\$s-\$b.json >/dev/null
    /usr/bin/python3 -c 'import json, sys; l = json.load(open(sys.argv[1])); e = sorted(l[\"evaluations\"] + l[\"epochs\"], key=lambda e: e[\"wall_s\"])
print(sys.argv[2], \"time to 80%:\", next((\"%.1f s\" % x[\"wall_s\"] for x in e if x[\"test_accuracy\"] >= 80), \"not reached\"), \"final accuracy:\", e[-1][\"test_accuracy\"])' \\
        \$logs/\$s-\$b.json \"\$s \$b\"
  done; done; rm -r \$logs"
  [lossy]="for s in both-loss mixed-8-loss lossy-4-compute lossy-4-mtu1500 lossy-6-mtu1500 lossy-8-mixed \\
    lossy-8-mtu1500-links lossy-4-skew lossy-6-light; do
  for loss in '' '--loss 0'; do
    $xagg bench hetero --scenario scenarios/\$s.json --systems xagg,tcp-ps,gloo --iterations 5 --rounds 2 \$loss; done; done"
  [planner]="out=\$(mktemp -d)
scripts/plan_accuracy.py --xagg $xagg --system xagg --iterations 3 --out \$out \
    \$(ls scenarios/*.json | grep -v equal-links-4-competing-aggregator)
rm -r \$out"
  [reliability]="log=\$(mktemp)
for t in bpf/bpf_tests reliability/control_fuzz_tests reliability/fault_tests e2e/failover_e2e_tests e2e/hierarchy_e2e_tests; do
  start=\$(date +%s); $build/tests/\$t >\$log 2>&1; echo \"\$t: \$((\$(date +%s) - start)) s\"
  grep -E 'detection|every rank failed' \$log || true; done; rm \$log"
)
all=(throughput capacity mtu result-modes reduce-scatter two-level scale-out congestion hetero lossy planner training reliability)

if [[ -n "${list:-}" ]]; then
  for name in "${all[@]}"; do printf '%s\n  %s\n' "$name" "${commands[$name]//$'\n'/$'\n'  }"; done
  exit 0
fi
((${#names[@]})) || names=("${all[@]}")
for name in "${names[@]}"; do
  [[ -v "commands[$name]" ]] || { echo "regenerate-results: no result named '$name' (--list shows them)" >&2; exit 2; }
done
[[ $(id -u) == 0 ]] || { echo "regenerate-results: needs root (network namespaces, XDP programs)" >&2; exit 1; }
[[ -x "$xagg" ]] || { echo "regenerate-results: $xagg not found: build first (make build) or pass --build DIR" >&2; exit 1; }

cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
version=$(sed -n 's/^#define XAGG_VERSION \([0-9]*\).*/\1/p' bpf/include/xagg_wire.h)
status=0
for name in "${names[@]}"; do
  file="docs/results/$name.md"
  output=$(mktemp)
  echo "== $name: ${commands[$name]}" >&2
  if ! bash -e -o pipefail -c "${commands[$name]}" >"$output"; then
    echo "regenerate-results: $name failed; $file left as it was" >&2
    rm -f "$output"; status=1; continue
  fi
  block=$(mktemp)
  {
    echo "Measured $(date -u +%Y-%m-%d) on $cpu ($(nproc) CPUs), protocol version $version,"
    echo "by \`scripts/regenerate-results.sh $name\`, which runs:"
    echo
    echo '```sh'
    echo "${commands[$name]//$build\//build/}"
    echo '```'
    echo
    echo '```'
    cat "$output"
    echo '```'
  } >"$block"
  # Replace what lies between the markers with the new block; the markers themselves stay.
  awk -v name="$name" -v block="$block" '
    $0 == "<!-- measured: " name " -->" { print; while ((getline line < block) > 0) print line; skipping = 1; found = 1; next }
    skipping && $0 == "<!-- end measured -->" { skipping = 0 }
    !skipping { print }
    END { if (!found || skipping) exit 1 }' "$file" >"$file.new" ||
    { echo "regenerate-results: $file lacks its measured markers" >&2; rm -f "$file.new" "$output" "$block"; exit 1; }
  mv "$file.new" "$file"
  rm -f "$output" "$block"
done
exit $status
