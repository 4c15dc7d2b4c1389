#!/usr/bin/env bash
# check_k8s.sh [ROOT]: offline checks of the Kubernetes manifests in
# ROOT/deploy/k8s (ctest: deploy.k8s_manifests).
#
#  1. validate_k8s.py --self-test: the validator rejects broken objects;
#  2. the dashboard copy in deploy/k8s/monitoring equals deploy/grafana's;
#  3. for every overlay: `kubectl kustomize` renders it (with the monitoring
#     kustomization), validate_k8s.py checks the objects against the
#     Kubernetes API schemas (python3-kubernetes), their references and
#     Fulcrum's flags (against the binaries' --helpfull when they are built);
#  4. the example job in the ConfigMap is accepted by a real scheduler (when
#     the binaries are built: a scheduler on a free loopback port, in memory);
#  5. yamllint on deploy/ (the project's relaxed configuration).
#
# Exit 77 (ctest SKIP_RETURN_CODE) without kubectl or python3-kubernetes.
# The binaries: $FULCRUM_BIN_DIR, else ROOT/${FULCRUM_BUILD_DIR:-build}/bin.
set -euo pipefail

ROOT="$(cd "${1:-$(dirname "$0")/../..}" && pwd)"
cd "$ROOT"
K8S=deploy/k8s
VALIDATOR=tests/deploy/validate_k8s.py

skip() {
  echo "SKIP: $* (install it: scripts/install-deps.sh)"
  exit 77
}

if ! command -v kubectl >/dev/null 2>&1; then
  skip "kubectl not found (Debian package kubernetes-client)"
fi
PYTHON=""
for candidate in python3 /usr/bin/python3; do
  if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import kubernetes, yaml' 2>/dev/null; then
    PYTHON="$candidate"
    break
  fi
done
if [ -z "$PYTHON" ]; then
  skip "no python3 with the kubernetes module (Debian package python3-kubernetes)"
fi

TMP="$(mktemp -d)"
SCHEDULER_PID=""
cleanup() {
  if [ -n "$SCHEDULER_PID" ]; then
    kill "$SCHEDULER_PID" 2>/dev/null || true
    wait "$SCHEDULER_PID" 2>/dev/null || true
  fi
  rm -rf "$TMP"
}
trap cleanup EXIT

failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

echo "== kubectl: $(kubectl version --client 2>/dev/null | head -n 1)"
echo "== python: $PYTHON ($("$PYTHON" -c 'import kubernetes; print("python3-kubernetes", kubernetes.__version__)'))"

echo "== validator self-test"
if ! "$PYTHON" "$VALIDATOR" --self-test; then
  fail "validate_k8s.py --self-test"
fi

echo "== Grafana dashboard copy"
if cmp -s deploy/grafana/fulcrum-dashboard.json "$K8S/monitoring/fulcrum-dashboard.json"; then
  echo "ok: $K8S/monitoring/fulcrum-dashboard.json equals deploy/grafana/fulcrum-dashboard.json"
else
  fail "$K8S/monitoring/fulcrum-dashboard.json differs from deploy/grafana/fulcrum-dashboard.json;" \
    "refresh it: cp deploy/grafana/fulcrum-dashboard.json $K8S/monitoring/"
fi

BIN_DIR="${FULCRUM_BIN_DIR:-$ROOT/${FULCRUM_BUILD_DIR:-build}/bin}"
BIN_ARGS=()
if [ -x "$BIN_DIR/fulcrum-server" ] && [ -x "$BIN_DIR/fulcrum-scheduler" ] && [ -x "$BIN_DIR/fulcrum-worker" ]; then
  BIN_ARGS=(--binaries "$BIN_DIR")
fi

render() {  # render DIR OUT: kubectl kustomize, its warnings shown only on failure
  if ! kubectl kustomize "$1" >"$2" 2>"$TMP/kustomize.err"; then
    cat "$TMP/kustomize.err"
    return 1
  fi
}

echo "== render $K8S/monitoring"
if ! render "$K8S/monitoring" "$TMP/monitoring.yaml"; then
  fail "kubectl kustomize $K8S/monitoring"
  : >"$TMP/monitoring.yaml"
fi

overlays=0
for dir in "$K8S"/overlays/*/; do
  overlay="$(basename "$dir")"
  overlays=$((overlays + 1))
  echo "== overlay $overlay: kubectl kustomize $K8S/overlays/$overlay (+ $K8S/monitoring) | validate_k8s.py"
  if ! render "$K8S/overlays/$overlay" "$TMP/$overlay.yaml"; then
    fail "kubectl kustomize $K8S/overlays/$overlay"
    continue
  fi
  if ! { cat "$TMP/$overlay.yaml"; echo "---"; cat "$TMP/monitoring.yaml"; } |
      "$PYTHON" "$VALIDATOR" "${BIN_ARGS[@]}"; then
    fail "overlay $overlay: validate_k8s.py"
  fi
done
if [ "$overlays" -eq 0 ]; then
  fail "no overlays under $K8S/overlays"
fi

echo "== example job spec"
if [ ${#BIN_ARGS[@]} -gt 0 ] && [ -x "$BIN_DIR/fulcrum" ]; then
  "$BIN_DIR/fulcrum-scheduler" --host=127.0.0.1 --port=0 --metrics-port=0 \
    --port-file="$TMP/scheduler.ports" >"$TMP/scheduler.log" 2>&1 &
  SCHEDULER_PID=$!
  for _ in $(seq 1 100); do
    [ -s "$TMP/scheduler.ports" ] && break
    sleep 0.1
  done
  port="$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["grpc_port"])' \
    "$TMP/scheduler.ports" 2>/dev/null || true)"
  if [ -z "$port" ]; then
    fail "the scheduler wrote no port file"
    cat "$TMP/scheduler.log"
  else
    for spec in "$K8S"/base/config/*.yaml; do
      if "$BIN_DIR/fulcrum" --scheduler "127.0.0.1:$port" submit -f "$spec" >"$TMP/submit.out" 2>&1; then
        echo "ok: $spec accepted by a scheduler (job $(cat "$TMP/submit.out"))"
      else
        fail "$spec rejected: $(cat "$TMP/submit.out")"
      fi
    done
  fi
else
  echo "not checked: no binaries in $BIN_DIR (build them, or set FULCRUM_BIN_DIR)"
fi

echo "== yamllint deploy/"
if command -v yamllint >/dev/null 2>&1; then
  if yamllint -f parsable -d '{extends: relaxed, rules: {line-length: {max: 200}}}' deploy/; then
    echo "ok: yamllint deploy/"
  else
    fail "yamllint deploy/"
  fi
else
  echo "not checked: yamllint not installed"
fi

if [ "$failures" -gt 0 ]; then
  echo "check_k8s: $failures failure(s)"
  exit 1
fi
echo "check_k8s: all checks passed ($overlays overlays)"
