#!/usr/bin/env bash
# Installs everything Telar needs on a fresh Debian 12 (bookworm). Idempotent:
# packages already present are skipped, and nothing runs when all are there.
set -euo pipefail

pkgs=(
  build-essential cmake pkg-config zlib1g-dev
  libtrilinos-kokkos-dev libtrilinos-kokkos-kernels-dev
  libopenblas-dev libdnnl-dev
  libopenmpi-dev openmpi-bin
  mpich libmpich-dev
  libhdf5-openmpi-dev libhdf5-mpich-dev python3-h5py
  libbenchmark-dev doxygen
  dataset-fashion-mnist
  libonnx-dev python3-onnx libprotobuf-dev python3-torch python3-torchvision python3-numpy
  slurm-wlm munge iproute2 fortunes
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

# The Debian archive apt already uses for bookworm (one-line or deb822
# sources): backports come from the same mirror, whichever it is.
bookworm_mirror() {
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    awk '$1 == "deb" && $0 ~ / bookworm / {for (i = 2; i <= NF; ++i) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' "$f"
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk 'BEGIN {RS = ""} /Suites:[^\n]* bookworm( |\n|$)/ && /Types:[^\n]*deb( |\n|$)/ {
           if (match($0, /URIs: *[^ \n]+/)) {u = substr($0, RSTART, RLENGTH); sub(/URIs: */, "", u); print u; exit}}' "$f"
  done
}
# Catch2 v3 lives in bookworm-backports only.
if ! grep -rqs "bookworm-backports" /etc/apt/sources.list /etc/apt/sources.list.d/; then
  mirror=$(bookworm_mirror | head -n 1)
  if [ -z "$mirror" ]; then
    echo "setup: no bookworm source in apt's configuration to take the backports mirror from" >&2
    exit 1
  fi
  echo "deb $mirror bookworm-backports main" |
    $SUDO tee /etc/apt/sources.list.d/bookworm-backports.list >/dev/null
fi
# Open MPI stays the default MPI (mpicc, mpicxx, mpirun, libmpi.so, mpi.pc);
# MPICH is only used through its suffixed commands (mpicxx.mpich,
# mpiexec.mpich). Debian ranks Open MPI higher, but an alternative set by
# hand or another architecture's priorities could flip: remember the MPI
# alternatives and put back any that the installation changed.
mpi_alternatives() {
  update-alternatives --get-selections 2>/dev/null | awk '$1 ~ /^(lib)?mpi/ {print $1, $3}' || true
}
before=$(mpi_alternatives)

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${pkgs[@]}"
$SUDO apt-get install -y -q --no-install-recommends -t bookworm-backports "${backports[@]}"

if [ -z "$before" ]; then
  # First MPI on this machine: Open MPI is the default.
  before=$(printf '%s\n' "mpi /usr/bin/mpicc.openmpi" "mpirun /usr/bin/mpirun.openmpi")
fi
while read -r name value; do
  [ -n "$name" ] && [ -e "$value" ] || continue
  now=$(update-alternatives --query "$name" 2>/dev/null | awk '$1 == "Value:" {print $2}')
  if [ "$now" != "$value" ]; then
    echo "setup: restoring the $name alternative to $value (was $now)"
    $SUDO update-alternatives --set "$name" "$value"
  fi
done <<<"$before"
echo "setup: done"
