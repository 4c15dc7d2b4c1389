#!/usr/bin/env bash
# ./scripts/demo.sh as the README gives it, on the default job: it must end 0
# and print a test accuracy of at least 0.8. Run by ctest with
# FULCRUM_DEMO_BUILT=1 and FULCRUM_BUILD_DIR set to the build tested.
set -uo pipefail
ROOT="$1"
out="$("$ROOT/scripts/demo.sh" 2>&1)"
rc=$?
echo "$out"
if [ $rc -ne 0 ]; then
  echo "demo.sh ended $rc" >&2
  exit 1
fi
if ! echo "$out" | grep -q 'final test accuracy: 0\.[89]'; then
  echo "demo.sh printed no test accuracy of 0.8 or more" >&2
  exit 1
fi
