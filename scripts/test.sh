#!/usr/bin/env bash
# Sets up (idempotent), builds and runs Telar's whole test suite twice: against
# Open MPI, the default MPI (in BUILD_DIR), then against MPICH (in
# BUILD_DIR_MPICH), and prints ctest's summary line for each.
#   bash scripts/test.sh                      # everything CI runs
#   TELAR_TEST_MPICH=0 bash scripts/test.sh   # Open MPI only
#   BUILD_DIR=... BUILD_DIR_MPICH=... JOBS=... CTEST_ARGS="-L mpi" bash scripts/test.sh
#   TELAR_MPICH_OPT=-O3 bash scripts/test.sh  # MPICH pass at -O3 (default -O1)
#   TELAR_TEST_OPT=-O3 bash scripts/test.sh   # Open MPI pass's tests at -O3 (default -O1)
# The MPICH pass leaves out the 8-rank composition test (label np8; its
# Open MPI run covers the 8-rank layouts): oversubscribed 8 ranks on 2 cores
# take 157 s under MPICH. It leaves out, and does not build, the tests that run
# as one process and never talk between ranks (label single_process: layer
# gradients, the planner, the ONNX importer's conformance, the compile-fail
# checks...), and the tests of several ranks that send nothing the
# equivalence tests do not (label one_mpi: the memory plan against the
# meter, ZeRO's bytes, the pipeline timeline, the CNN, recomputation,
# run-time graph and ONNX equivalence tests, the add_subdirectory
# consumer), nor the examples whose runs of several ranks are such tests
# (CNN, GPT, ONNX, ResNet: TELAR_ONE_MPI_EXAMPLES; the Fashion-MNIST,
# hyper-parameter search and U-Net examples, the launch, failure and error
# catalogue paths, run under both): the Open MPI pass runs them.
# CTEST_ARGS_MPICH="" and TELAR_MPICH_SINGLE_PROCESS=ON run everything there
# too. TELAR_EXAMPLE_OPT sets the Open MPI pass's examples' level (-O1).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
BUILD_DIR=${BUILD_DIR:-build}
BUILD_DIR_MPICH=${BUILD_DIR_MPICH:-build-mpich}
JOBS=${JOBS:-$(nproc)}

summary=()
status=0
# suite <name> <build dir> <ctest arguments> [configure arguments...]: configure,
# build, ctest.
suite() {
  local name=$1 dir=$2 args=$3
  shift 3
  local start=$SECONDS
  echo "== $name: $dir"
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release "$@"
  cmake --build "$dir" -j "$JOBS"
  local built=$((SECONDS - start)) rc=0
  # The 8-rank composition test carries the label 'np8' (ctest -L np8 runs it
  # alone; CTEST_ARGS="-LE np8" leaves it out on a busy machine).
  # shellcheck disable=SC2086
  (cd "$dir" && ctest --output-on-failure -j "$JOBS" $args) | tee "$dir/ctest.log" || rc=$?
  ((rc == 0)) || status=1
  local line
  line=$(grep -E "tests passed|No tests were found" "$dir/ctest.log" | tail -n 1 || true)
  summary+=("$name: ${line:-ctest failed (exit $rc)} (build ${built} s, tests $((SECONDS - start - built)) s)")
}

# What each pass builds (docs/design.md, "Compile time"): the Open MPI pass at
# -O3 (Release) with its test programs and examples at -O1 (the
# same IEEE arithmetic: the same results), with the self-contained header
# check; the MPICH pass at -O1 (0.55 of the compile time of -O3:
# test_losses.cpp 26.0 s against 47.3 s; the same IEEE arithmetic: no
# -ffast-math at any level, so the same results), without the single-process
# tests (above), with the benchmarks at -O0. No test runs the benchmarks: they
# are built to show that they compile, which -O0 shows as well as -O3 (build
# them yourself at -O3 to take figures). The header check does not depend on
# the MPI implementation, so it runs once. The Doxygen target is not part of
# the build. Without the MPICH pass, the Open MPI pass builds the benchmarks
# (at -O3). Both passes compile each example that is split over several files
# as one (TELAR_UNITY_EXAMPLES): less CPU when every core is busy.
benchmarks_here=OFF
[[ "${TELAR_TEST_MPICH:-1}" != 0 ]] || benchmarks_here=ON
suite "Open MPI" "$BUILD_DIR" "${CTEST_ARGS:-}" -DTELAR_ENABLE_BENCHMARKS=$benchmarks_here \
  -DTELAR_UNITY_EXAMPLES=ON "-DTELAR_TEST_CXX_FLAGS=${TELAR_TEST_OPT:--O1}" \
  "-DTELAR_EXAMPLE_CXX_FLAGS=${TELAR_EXAMPLE_OPT:--O1}"
if [[ "${TELAR_TEST_MPICH:-1}" != 0 ]]; then
  # The same tests and examples, built with MPICH's compiler wrappers and run
  # with its mpiexec.
  echo "== MPICH: benchmarks built here at ${TELAR_BENCH_OPT:--O0}; header check in the Open MPI pass only"
  suite "MPICH" "$BUILD_DIR_MPICH" "${CTEST_ARGS_MPICH--LE np8|single_process|one_mpi} ${CTEST_ARGS:-}" \
    -DMPI_C_COMPILER=/usr/bin/mpicc.mpich -DMPI_CXX_COMPILER=/usr/bin/mpicxx.mpich \
    -DMPIEXEC_EXECUTABLE=/usr/bin/mpiexec.mpich \
    -DTELAR_ENABLE_BENCHMARKS=ON "-DTELAR_BENCH_CXX_FLAGS=${TELAR_BENCH_OPT:--O0}" \
    -DTELAR_CHECK_HEADERS=OFF -DTELAR_ENABLE_DOCS=OFF \
    -DTELAR_UNITY_EXAMPLES=ON -DTELAR_TEST_CXX_FLAGS= \
    -DTELAR_SINGLE_PROCESS_TESTS=${TELAR_MPICH_SINGLE_PROCESS:-OFF} \
    -DTELAR_ONE_MPI_TESTS=${TELAR_MPICH_SINGLE_PROCESS:-OFF} \
    -DTELAR_ONE_MPI_EXAMPLES=${TELAR_MPICH_SINGLE_PROCESS:-OFF} \
    "-DCMAKE_CXX_FLAGS_RELEASE=${TELAR_MPICH_OPT:--O1} -DNDEBUG"
else
  echo "== MPICH: skipped (TELAR_TEST_MPICH=0)"
fi
echo "== summary"
printf '%s\n' "${summary[@]}"
exit $status
