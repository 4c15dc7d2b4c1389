#!/usr/bin/env bash
# The checks beyond the Release suite, each in its own build folder with
# Debian's clang (scripts/test.sh runs them after the Release suite; run one
# alone with e.g. `scripts/checks.sh asan`):
#   asan   clang with -Wthread-safety -Werror (every lock annotated), ASan +
#          UBSan, libFuzzer instrumentation: the unit tests, the quicker
#          integration tests (a real cluster of ASan processes), then each
#          fuzz target over its seed corpus for FULCRUM_FUZZ_SECONDS (15),
#          two at a time (reported as "fuzz")
#   tsan   clang with ThreadSanitizer: the unit tests of the in-process
#          concurrency (stores, held pulls, checkpoint writer, scheduler,
#          membership client, thread pool...). The suites built around
#          in-process gRPC servers run under ASan only: Debian's gRPC is not
#          built with TSan, and the hand-overs inside it make TSan report
#          races it cannot order (tests/tsan.supp says more).
#   tidy   clang-tidy (bugprone-*, concurrency-*, .clang-tidy) on every source,
#          over the ASan build's unity batches
# Each prints its ctest output; the last line of each is
#   "<check>: N passed, M failed, K skipped"
# and the exit code is non-zero if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
JOBS="${FULCRUM_JOBS:-$(nproc)}"
CHECKS=("$@")
[ ${#CHECKS[@]} -eq 0 ] && CHECKS=(asan tsan tidy)
rc=0

# Runs ctest in $1 with the remaining arguments; prints the summary line.
run_ctest() {
  local dir="$1" name="$2"
  shift 2
  local log
  log="$(mktemp)"
  # -j: unit tests a core each, integration tests alone (RUN_SERIAL).
  local t=$SECONDS
  ( cd "$dir" && ctest --output-on-failure --timeout 600 -j "$JOBS" "$@" ) 2>&1 | tee "$log"
  local status=${PIPESTATUS[0]}
  echo "time: $name tests $((SECONDS - t)) s"
  local summary skipped total failed
  summary="$(grep -E '^[0-9]+% tests passed' "$log" | tail -1)"
  skipped="$(grep -c '\*\*\*Skipped' "$log" || true)"
  rm -f "$log"
  if [ -z "$summary" ]; then
    echo "$name: ctest did not run"
    return 1
  fi
  total="$(echo "$summary" | sed -E 's/.* out of ([0-9]+).*/\1/')"
  failed="$(echo "$summary" | sed -E 's/^[0-9]+% tests passed, ([0-9]+) tests? failed.*/\1/')"
  echo "$name: $((total - failed - skipped)) passed, ${failed} failed, ${skipped} skipped"
  return "$status"
}

configure() {
  local dir="$1"
  shift
  if [ ! -f "$dir/build.ninja" ]; then
    CC=clang CXX=clang++ cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFULCRUM_CUDA=OFF \
      -DCMAKE_EXPORT_COMPILE_COMMANDS=ON "$@" >&2 || return 1
  fi
}

for check in "${CHECKS[@]}"; do
  case "$check" in
    asan)
      configure build-asan -DFULCRUM_SANITIZE=address,undefined -DFULCRUM_FUZZ=ON \
        -DFULCRUM_FUZZ_SECONDS="${FULCRUM_FUZZ_SECONDS:-15}" || { echo "asan: configure failed"; rc=1; continue; }
      t=$SECONDS
      cmake --build build-asan -j "$JOBS" >&2 || { echo "asan: build failed"; rc=1; continue; }
      echo "time: asan build $((SECONDS - t)) s"
      # Left to the Release suite: the slow multi-process suites, the
      # click-model AUC sweep (a minute of ASan cluster time over the same
      # server and worker paths the other click cluster tests run here), and
      # HalfArray's exhaustive sweep of every float (arithmetic on one
      # array; 36 s under ASan for nothing ASan could find).
      ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        run_ctest build-asan asan -L "unit|integration" \
          -E "^(HalfArray|ClusterTest.ClickModelsApproach|BackendClick|Checkpoint|TableJoin|Observability|ServerFailover|ReReplication|ServerJoin|ServerLeave|Ssp|PushOverlap|WorkerJoin|SchedulerRestart|ReplacedServer|ReplicatedTables|ReplacedTableServer|StoppedPrimary|Chaos)" \
          || rc=1
      # The fuzz targets are single-threaded and run for a fixed time each:
      # two at once, one a core.
      ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        run_ctest build-asan fuzz -L fuzz || rc=1
      ;;
    tsan)
      configure build-tsan -DFULCRUM_SANITIZE=thread -DFULCRUM_BENCH=OFF || { echo "tsan: configure failed"; rc=1; continue; }
      t=$SECONDS
      cmake --build build-tsan -j "$JOBS" --target common_test server_test scheduler_test worker_test client_test \
        >&2 || { echo "tsan: build failed"; rc=1; continue; }
      echo "time: tsan build $((SECONDS - t)) s"
      # The suppressions, and one called_from_lib line per uninstrumented
      # gRPC / Abseil / protobuf library the test binaries load.
      supp="$(pwd)/build-tsan/tsan.supp"
      { cat tests/tsan.supp
        for b in common_test server_test scheduler_test worker_test client_test; do ldd "build-tsan/bin/$b"; done |
          awk '{print $1}' | grep -E '^lib(grpc|gpr|absl_|protobuf|upb|re2|cares|address_sorting)' | sort -u |
          sed 's/^/called_from_lib:/'; } > "$supp"
      # Also left out: HalfArray's exhaustive sweep of every float (one
      # thread's arithmetic, 50 s under TSan for nothing it could find).
      TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$supp" \
        run_ctest build-tsan tsan -L unit \
          -E "^(AllBackends|Backend|Mlp|PluginLoader|GateTest|WaitingCallsTest|ParameterClientTest|ParameterServiceTest|ParameterServiceSparseTest|ParameterServiceReplicationTest|ParameterServiceRequestWaitTest|ParameterServiceAnswerWaitTest|ServerLimitsTest|GrpcServerControlTest.CallsRefusedAsBusy|HalfArrayTest.Fp16EncodingMatchesTheScalarOneOnEveryFloat)" \
          || rc=1
      ;;
    tidy)
      # clang-tidy over the ASan build's unity batches (their compile
      # commands): the checks walk every declaration of a translation unit,
      # the gRPC, protobuf and Abseil headers' included, so a batch of 8
      # sources costs little more than one. Each source's findings are
      # reported as a header's are (.clang-tidy's HeaderFilterRegex takes
      # .cc). Sources outside every batch (those with compile options of
      # their own) go alone. Only the generated protobuf headers are made.
      configure build-asan -DFULCRUM_SANITIZE=address,undefined -DFULCRUM_FUZZ=ON ||
        { echo "tidy: configure failed"; rc=1; continue; }
      headers=$(ninja -C build-asan -t targets all | grep -oE '^proto/[^:]*\.pb\.h' | sort -u)
      # shellcheck disable=SC2086
      ninja -C build-asan -j "$JOBS" $headers >&2 || { echo "tidy: protoc failed"; rc=1; continue; }
      units=$(grep -oE '"file": "[^"]*/Unity/unity_[0-9]+_cxx\.cxx"' build-asan/compile_commands.json |
        sed -E 's/^"file": "(.*)"$/\1/' | sort -u)
      sources=$(git ls-files '*.cc' | grep -v '^kernels/cuda/' | sed "s|^|$(pwd)/|" | sort -u)
      # shellcheck disable=SC2086
      batched=$(grep -ohE '^#include "[^"]*"' $units | sed -E 's/^#include "(.*)"$/\1/' | sort -u)
      alone=$(comm -23 <(echo "$sources") <(echo "$batched"))
      log="$(mktemp)"
      t=$SECONDS
      # A batch's own file includes sources: bugprone-suspicious-include is
      # left out.
      # shellcheck disable=SC2086
      if run-clang-tidy -quiet -p build-asan -j "$JOBS" -checks=-bugprone-suspicious-include $units $alone >"$log" 2>&1; then
        echo "tidy: 1 passed, 0 failed, 0 skipped ($(echo "$sources" | wc -l) sources clean: $(echo "$units" | wc -l) batches, $(echo "$alone" | grep -c .) alone)"
      else
        grep -E "error:|warning:" "$log" | sort -u | head -100
        echo "tidy: 0 passed, 1 failed, 0 skipped"
        rc=1
      fi
      rm -f "$log"
      echo "time: tidy $((SECONDS - t)) s"
      ;;
    *)
      echo "unknown check $check (asan, tsan or tidy)"
      rc=1
      ;;
  esac
done
exit $rc
