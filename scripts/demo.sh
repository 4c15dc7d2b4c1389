#!/usr/bin/env bash
# The two-minute tour: installs what is missing, builds, starts a local
# cluster on loopback (1 scheduler, 2 servers, 2 workers), trains the
# Fashion-MNIST MLP and prints its test accuracy. Every process it starts is
# stopped on exit, also on Ctrl-C.
set -euo pipefail
# A SPEC given relative to where the script was run from, before the cd.
if [ $# -ge 1 ] && [ -f "$1" ]; then
  set -- "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")" "${@:2}"
fi
cd "$(dirname "$0")/.."
ROOT="$(pwd)"

# FULCRUM_DEMO_BUILT=1 (the suite's run of this script): the build is there.
if [ "${FULCRUM_DEMO_BUILT:-0}" != 1 ]; then
  ./scripts/install-deps.sh
  echo "building (Release)..." >&2
  ./scripts/build.sh
fi
BUILD_DIR="${FULCRUM_BUILD_DIR:-build}"
case "$BUILD_DIR" in /*) ;; *) BUILD_DIR="$ROOT/$BUILD_DIR" ;; esac
FULCRUM="$BUILD_DIR/bin/fulcrum"

DIR="$(mktemp -d "${TMPDIR:-/tmp}/fulcrum-demo.XXXXXX")"
KEEP_LOGS=0
cleanup() {
  "$FULCRUM" local down --dir "$DIR" >/dev/null 2>&1 || true
  if [ "$KEEP_LOGS" = 1 ]; then
    echo "logs kept in $DIR/logs" >&2
  else
    rm -rf "$DIR"
  fi
}
trap cleanup EXIT
trap 'echo; echo "interrupted: stopping the local cluster" >&2; exit 130' INT TERM

"$FULCRUM" local up --servers 2 --workers 2 --dir "$DIR" --detach
echo
SPEC="${1:-examples/fashion-mnist-mlp.yaml}"
echo "submitting $SPEC"
JOB_ID="$("$FULCRUM" submit -f "$SPEC" --dir "$DIR")"
set +e
"$FULCRUM" watch "$JOB_ID" --dir "$DIR"
rc=$?
set -e
echo
"$FULCRUM" get "$JOB_ID" --dir "$DIR"
if [ $rc -ne 0 ]; then
  KEEP_LOGS=1
  echo "the job did not succeed; the last lines of the logs in $DIR/logs:" >&2
  tail -n 5 "$DIR"/logs/*.log >&2 || true
  exit $rc
fi
JSON="$("$FULCRUM" get "$JOB_ID" -o json --dir "$DIR")"
# A job without one of them (a softmax job has no AUC) leaves it empty: with
# pipefail, grep finding nothing would end the script.
ACC="$(echo "$JSON" | { grep -o '"testAccuracy": [0-9.]*' || true; } | head -1 | awk '{print $2}')"
AUC="$(echo "$JSON" | { grep -o '"testAuc": [0-9.]*' || true; } | head -1 | awk '{print $2}')"
echo
echo "final test accuracy: ${ACC}"
if [ -n "$AUC" ]; then
  # Click models on synthetic data: the workers log the best AUC the data allows.
  BEST="$({ grep -ho "best reachable AUC (the true probabilities') [0-9.]*" "$DIR"/logs/*.log || true; } | head -1 | awk '{print $NF}')"
  echo "final test AUC: ${AUC}${BEST:+ (the true click probabilities reach ${BEST})}"
fi
