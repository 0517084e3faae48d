#!/usr/bin/env bash
# Sets up (idempotent), builds and runs the demo: an MLP trained on
# Fashion-MNIST, serially and then with data parallelism over 2 ranks.
#   bash scripts/demo.sh                 # both runs
#   bash scripts/demo.sh --epochs 1      # extra flags go to fashion_mnist
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" --target fashion_mnist
exe="$BUILD_DIR/examples/01_fashion_mnist/fashion_mnist"
# One thread per rank: ranks are the parallelism here.
export OMP_NUM_THREADS=1
echo "== serial"
"$exe" --epochs 3 --json "$@"
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
echo "== data parallel, 2 ranks"
mpirun -np 2 "$exe" --epochs 3 --json --dp 2 "$@"
