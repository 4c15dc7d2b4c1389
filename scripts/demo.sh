#!/usr/bin/env bash
# The two-minute tour: installs what is missing, builds, starts a local
# cluster on loopback (1 scheduler, 2 servers, 2 workers), trains the
# Fashion-MNIST MLP and prints its test accuracy. Every process it starts is
# stopped on exit, also on Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"

./scripts/install-deps.sh
echo "building (Release)..." >&2
./scripts/build.sh
FULCRUM="$ROOT/${FULCRUM_BUILD_DIR:-build}/bin/fulcrum"

DIR="$(mktemp -d "${TMPDIR:-/tmp}/fulcrum-demo.XXXXXX")"
cleanup() {
  "$FULCRUM" local down --dir "$DIR" >/dev/null 2>&1 || true
  rm -rf "$DIR"
}
trap cleanup EXIT
trap 'echo; echo "interrupted: stopping the local cluster" >&2; exit 130' INT TERM

"$FULCRUM" local up --servers 2 --workers 2 --dir "$DIR" --detach
echo
JOB="${1:-examples/fashion-mnist-mlp.yaml}"
echo "submitting $JOB"
set +e
"$FULCRUM" submit -f "$JOB" --wait --dir "$DIR"
rc=$?
set -e
if [ $rc -ne 0 ]; then
  echo "the job did not succeed; logs are in $DIR/logs:" >&2
  tail -n 5 "$DIR"/logs/*.log >&2 || true
  trap - EXIT
  "$FULCRUM" local down --dir "$DIR" >/dev/null 2>&1 || true
  exit $rc
fi
JOB_ID="$("$FULCRUM" list -o json --dir "$DIR" | python3 -c 'import json,sys; print(json.load(sys.stdin)["jobs"][-1]["jobId"])' 2>/dev/null || true)"
if [ -n "$JOB_ID" ]; then
  echo
  "$FULCRUM" get "$JOB_ID" --dir "$DIR"
fi
ACC="$("$FULCRUM" list -o json --dir "$DIR" | grep -o '"testAccuracy": [0-9.]*' | tail -1 | awk '{print $2}')"
echo
echo "final test accuracy: ${ACC}"
