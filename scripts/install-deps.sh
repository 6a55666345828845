#!/usr/bin/env bash
# Installs every Debian package XAgg needs to build, test and run (Debian 12, root).
# Quick when everything is already there: apt runs only for missing packages.
set -euo pipefail

packages=(
  build-essential cmake pkg-config git
  clang llvm libbpf-dev bpftool libelf-dev zlib1g-dev linux-libc-dev
  iproute2 ethtool procps kmod nftables
  libgtest-dev libgmock-dev
  libcli11-dev nlohmann-json3-dev libspdlog-dev libfmt-dev libssl-dev
  libgloo-dev libclang-rt-14-dev python3-matplotlib
  libtorch-dev python3-torch python3-torchvision python3-setuptools python3-numpy pybind11-dev
  dataset-fashion-mnist libopenblas0-pthread
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: missing packages (${missing[*]}) and not root: run as root" >&2
    exit 1
  fi
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
