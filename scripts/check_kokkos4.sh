#!/usr/bin/env bash
# Configures and builds Telar's tests and examples against a Kokkos 4.x
# installation and reports which targets fail to compile; with RUN_TESTS=1 it
# then runs ctest. Not run by CI (CI has Debian's Kokkos 3.4 only).
#
# By default it builds the target 'all' of a build without benchmarks and
# docs: the header check, every test binary and the examples, so every test
# ctest runs has been built (the list comes from the build and cannot drift).
#
#   KOKKOS4_ROOT=/opt/kokkos4-omp bash scripts/check_kokkos4.sh            # OpenMP
#   KOKKOS4_ROOT=/opt/kokkos4-omp RUN_TESTS=1 bash scripts/check_kokkos4.sh # ... and ctest
#   KOKKOS4_ROOT=/opt/kokkos4-cuda CXX_WRAPPER=/path/to/kokkos/bin/nvcc_wrapper \
#       bash scripts/check_kokkos4.sh                                       # CUDA: compile only
#
# Settings (environment):
#   KOKKOS4_ROOT   Kokkos 4 install prefix (required)
#   CXX_WRAPPER    C++ compiler to use, e.g. Kokkos' nvcc_wrapper for CUDA
#                  (default: Kokkos' own bin/nvcc_wrapper when Kokkos has CUDA
#                  and one is installed, else CMake's choice)
#   CUDA_HOME      CUDA toolkit, put on PATH for nvcc_wrapper (default /usr/local/cuda)
#   BUILD_DIR      build directory (default build-kokkos4)
#   JOBS           parallel compile jobs per target (default 2; CUDA compiles are heavy)
#   TARGETS        space-separated targets, built one at a time (default: all);
#                  "rooms": the header check and one test per room of include/telar
#                  (the quick CUDA/HIP check); with RUN_TESTS=1, tests whose binary
#                  is not among them fail
#   GPU_AWARE_MPI  ON passes -DTELAR_ENABLE_GPU_AWARE_MPI=ON (default OFF)
#   RUN_TESTS      1 runs ctest afterwards (needs a host backend or a GPU)
#   OMP_THREADS    OMP_NUM_THREADS for the tests (default 2)
#   CMAKE_ARGS     extra arguments for the configure step
set -uo pipefail
cd "$(dirname "$0")/.."

if [[ -z "${KOKKOS4_ROOT:-}" ]]; then
  echo "check_kokkos4.sh: set KOKKOS4_ROOT to a Kokkos 4.x install prefix" >&2
  exit 2
fi
BUILD_DIR=${BUILD_DIR:-build-kokkos4}
JOBS=${JOBS:-2}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
TARGETS=${TARGETS:-all}
# One test program per room of include/telar (core and layers, comm, data, io,
# onnx, optim, parallel, schedule, train and profile), and every header alone.
if [[ "$TARGETS" == rooms ]]; then
  TARGETS="telar_self_contained_headers test_layer_zoo test_comm_allreduce test_data test_volume
           test_onnx test_optim test_zero_memory test_schedule test_train_timeline"
fi

config_args=(-DKokkos_ROOT="$KOKKOS4_ROOT" -DCMAKE_BUILD_TYPE=Release
             -DTELAR_ENABLE_TESTS=ON -DTELAR_ENABLE_EXAMPLES=ON -DTELAR_ENABLE_BENCHMARKS=OFF
             -DTELAR_ENABLE_GPU_AWARE_MPI="${GPU_AWARE_MPI:-OFF}"
             -DTELAR_TEST_OMP_NUM_THREADS="${OMP_THREADS:-2}")
# Kokkos with CUDA wants its nvcc_wrapper as the C++ compiler.
kokkos_has_cuda=0
if grep -qsE "^#define KOKKOS_ENABLE_CUDA( |$)" "$KOKKOS4_ROOT/include/KokkosCore_config.h"; then
  kokkos_has_cuda=1
fi
if [[ -z "${CXX_WRAPPER:-}" && $kokkos_has_cuda == 1 && -x "$KOKKOS4_ROOT/bin/nvcc_wrapper" ]]; then
  CXX_WRAPPER="$KOKKOS4_ROOT/bin/nvcc_wrapper"
fi
if [[ -n "${CXX_WRAPPER:-}" ]]; then
  config_args+=(-DCMAKE_CXX_COMPILER="$CXX_WRAPPER")
fi
if [[ $kokkos_has_cuda == 1 && -d "$CUDA_HOME/bin" ]]; then
  export PATH="$CUDA_HOME/bin:$PATH"
fi

echo "== configure $BUILD_DIR against $KOKKOS4_ROOT"
# shellcheck disable=SC2086
if ! cmake -S . -B "$BUILD_DIR" "${config_args[@]}" ${CMAKE_ARGS:-}; then
  echo "check_kokkos4.sh: configure failed" >&2
  exit 1
fi

failed=()
for t in $TARGETS; do
  echo "== build $t"
  log="$BUILD_DIR/check_kokkos4_build.log"
  # -k: go on after a failure, so one run names every target that fails.
  keep_going=()
  if [[ "$t" == all ]]; then
    keep_going=(-- -k)
    grep -qs "^CMAKE_GENERATOR:INTERNAL=Ninja" "$BUILD_DIR/CMakeCache.txt" && keep_going=(-- -k 0)
  fi
  if ! cmake --build "$BUILD_DIR" --target "$t" -j "$JOBS" "${keep_going[@]}" 2>&1 | tee "$log"; then
    if [[ "$t" == all ]]; then
      # The targets whose objects failed: ".../CMakeFiles/<target>.dir/...".
      mapfile -t bad < <(grep -E "^(make|ninja|FAILED|gmake).*CMakeFiles/[^/]+\.dir/" "$log" |
        sed -E 's|.*CMakeFiles/([^/]+)\.dir/.*|\1|' | sort -u)
      failed+=("${bad[@]:-all}")
    else
      failed+=("$t")
    fi
  fi
done

status=0
if ((${#failed[@]})); then
  echo "check_kokkos4.sh: failed to build: ${failed[*]}" >&2
  status=1
else
  echo "check_kokkos4.sh: every target built against $KOKKOS4_ROOT"
fi

if [[ "${RUN_TESTS:-0}" == 1 && $status == 0 ]]; then
  echo "== ctest"
  echo "check_kokkos4.sh: not run here: the 8-rank test (label np8) and the compile_fail tests" \
       "(they do not depend on the backend; ctest -L 'np8|compile_fail' runs them)"
  (cd "$BUILD_DIR" && ctest --output-on-failure -j1 -LE "np8|compile_fail") || status=1
fi
exit $status
