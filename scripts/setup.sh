#!/usr/bin/env bash
# Installs everything Telar needs on a fresh Debian 12 (bookworm). Idempotent:
# packages already present are skipped, and nothing runs when all are there.
set -euo pipefail

pkgs=(
  build-essential cmake pkg-config zlib1g-dev
  libtrilinos-kokkos-dev libtrilinos-kokkos-kernels-dev
  libopenblas-dev libdnnl-dev
  libopenmpi-dev openmpi-bin
  libbenchmark-dev doxygen
  dataset-fashion-mnist
)
backports=(catch2)

missing=()
for p in "${pkgs[@]}" "${backports[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all dependencies present"
  exit 0
fi
echo "setup: installing ${missing[*]}"

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

# Catch2 v3 lives in bookworm-backports only.
if ! grep -rqs "bookworm-backports" /etc/apt/sources.list /etc/apt/sources.list.d/; then
  echo "deb http://deb.debian.org/debian bookworm-backports main" |
    $SUDO tee /etc/apt/sources.list.d/bookworm-backports.list >/dev/null
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${pkgs[@]}"
$SUDO apt-get install -y -q --no-install-recommends -t bookworm-backports "${backports[@]}"
echo "setup: done"
