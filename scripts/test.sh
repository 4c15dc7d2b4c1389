#!/usr/bin/env bash
# Installs what is missing, builds everything and runs the whole suite (unit
# and multi-process integration tests). The last line is the CTest summary.
set -uo pipefail
cd "$(dirname "$0")/.."

./scripts/install-deps.sh || exit 1
./scripts/build.sh || { echo "build failed"; exit 1; }
BUILD_DIR="${FULCRUM_BUILD_DIR:-build}"

LOG="$(mktemp)"
# Integration tests start their own processes; run test binaries one at a
# time on small machines so that timing-sensitive parts (leases) keep margin.
( cd "$BUILD_DIR" && ctest --output-on-failure --timeout 600 "$@" ) 2>&1 | tee "$LOG"
rc=${PIPESTATUS[0]}
summary="$(grep -E '^[0-9]+% tests passed' "$LOG" | tail -1)"
skipped="$(grep -c '\*\*\*Skipped' "$LOG" || true)"
rm -f "$LOG"
if [ -z "$summary" ]; then
  echo "ctest did not run"
  exit 1
fi
passed_failed="$(echo "$summary" | sed -E 's/^[0-9]+% tests passed, ([0-9]+) tests? failed out of ([0-9]+)/\2 \1/')"
total="${passed_failed% *}"
failed="${passed_failed#* }"
echo "ctest: $((total - failed - skipped)) passed, ${failed} failed, ${skipped} skipped"
exit $rc
