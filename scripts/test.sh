#!/usr/bin/env bash
# Installs what is missing, builds everything and runs the whole suite: the
# unit and multi-process integration tests of the Release build, then the
# checks of scripts/checks.sh (clang -Wthread-safety with ASan + UBSan and
# the fuzz targets, ThreadSanitizer, clang-tidy; FULCRUM_SKIP_CHECKS=1 skips
# them). Extra arguments go to the Release ctest (e.g. -L unit). The last
# line is the summary of every test run.
set -uo pipefail
cd "$(dirname "$0")/.."

./scripts/install-deps.sh || exit 1
# Where the time goes: a "time: PHASE N s" line after each phase.
t=$SECONDS
./scripts/build.sh || { echo "build failed"; exit 1; }
echo "time: release build $((SECONDS - t)) s"
BUILD_DIR="${FULCRUM_BUILD_DIR:-build}"

LOG="$(mktemp)"
t=$SECONDS
# Unit tests run a core each; integration tests start clusters of processes
# whose leases want the machine, so each runs alone (RUN_SERIAL, set by
# fulcrum_test in CMakeLists.txt).
( cd "$BUILD_DIR" && ctest --output-on-failure --timeout 600 -j "${FULCRUM_JOBS:-$(nproc)}" "$@" ) 2>&1 | tee "$LOG"
rc=${PIPESTATUS[0]}
echo "time: release tests $((SECONDS - t)) s"
summary="$(grep -E '^[0-9]+% tests passed' "$LOG" | tail -1)"
skipped="$(grep -c '\*\*\*Skipped' "$LOG" || true)"
rm -f "$LOG"
if [ -z "$summary" ]; then
  echo "ctest did not run"
  exit 1
fi
total="$(echo "$summary" | sed -E 's/.* out of ([0-9]+).*/\1/')"
failed="$(echo "$summary" | sed -E 's/^[0-9]+% tests passed, ([0-9]+) tests? failed.*/\1/')"
passed=$((total - failed - skipped))
echo "release: ${passed} passed, ${failed} failed, ${skipped} skipped"
detail="release ${passed}"

if [ "${FULCRUM_SKIP_CHECKS:-0}" != "1" ]; then
  CHECKS_LOG="$(mktemp)"
  ./scripts/checks.sh 2>&1 | tee "$CHECKS_LOG"
  [ "${PIPESTATUS[0]}" -ne 0 ] && rc=1
  while read -r name p f s; do
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
    detail="$detail, ${name%:} ${p}"
  done < <(grep -E '^(asan|fuzz|tsan|tidy): [0-9]+ passed' "$CHECKS_LOG" | sed -E 's/^([a-z]+): ([0-9]+) passed, ([0-9]+) failed, ([0-9]+) skipped.*/\1 \2 \3 \4/')
  rm -f "$CHECKS_LOG"
fi
echo "ctest: ${passed} passed, ${failed} failed, ${skipped} skipped (${detail})"
[ "$failed" -ne 0 ] && rc=1
exit $rc
