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
#     the Secrets the user creates (fulcrum-tls, fulcrum-tokens; see
#     deploy/k8s/README.md) are declared to it with their keys. Overlays named
#     *-tls must turn mTLS on, the others must stay plaintext. With
#     $FULCRUM_KUBECTL_COMPAT (another kubectl, e.g. Debian's 1.20 with
#     kustomize v2.0.3 when kubectl is newer) every overlay must render with
#     it too, to the same objects (the ConfigMap's hash aside);
#  4. no key material and no Secret object anywhere under deploy/;
#  5. the example job in the ConfigMap is accepted by a real scheduler (when
#     the binaries are built: a scheduler on a free loopback port, in memory);
#  6. overlays/cpu-tls on a real scheduler (binaries and openssl): the
#     scheduler pod's args and environment as rendered (tests/deploy/
#     pod_command.py), /etc/fulcrum laid out under a temporary folder with
#     the Secrets made by scripts/dev-certs.sh as the README creates them; the
#     CLI with the pod's environment submits the example job and lists the
#     cluster, and is refused without the token or without TLS;
#  7. yamllint on deploy/ (the project's relaxed configuration).
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
TLS_SCHEDULER_PID=""
cleanup() {
  for pid in "$SCHEDULER_PID" "$TLS_SCHEDULER_PID"; do
    if [ -n "$pid" ]; then
      kill "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
    fi
  done
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

# The Secrets the user creates (deploy/k8s/README.md, "TLS and tokens") and
# their keys; the manifests carry no Secret object.
USER_SECRETS=(--secret "fulcrum-tls:ca.crt,tls.crt,tls.key" --secret "fulcrum-tokens:cluster-token,token")

render() {  # render DIR OUT: $KUBECTL (kubectl) kustomize, its warnings shown only on failure
  if ! "${KUBECTL:-kubectl}" kustomize "$1" >"$2" 2>"$TMP/kustomize.err"; then
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
      "$PYTHON" "$VALIDATOR" "${BIN_ARGS[@]}" "${USER_SECRETS[@]}"; then
    fail "overlay $overlay: validate_k8s.py"
  fi
  if [ -n "${FULCRUM_KUBECTL_COMPAT:-}" ]; then
    if ! KUBECTL="$FULCRUM_KUBECTL_COMPAT" render "$K8S/overlays/$overlay" "$TMP/compat-$overlay.yaml"; then
      fail "$FULCRUM_KUBECTL_COMPAT kustomize $K8S/overlays/$overlay"
    elif "$PYTHON" - "$TMP/$overlay.yaml" "$TMP/compat-$overlay.yaml" <<'EOF'
import re, sys, yaml
def objects(path):
    text = re.sub(r"fulcrum-config-[a-z0-9]{10}\b", "fulcrum-config-HASH", open(path).read())
    return sorted(yaml.safe_dump(d, sort_keys=True) for d in yaml.safe_load_all(text) if d)
sys.exit(0 if objects(sys.argv[1]) == objects(sys.argv[2]) else 1)
EOF
    then
      echo "ok: $FULCRUM_KUBECTL_COMPAT renders overlay $overlay to the same objects"
    else
      fail "overlay $overlay: $FULCRUM_KUBECTL_COMPAT renders other objects (the ConfigMap hash aside)"
      diff "$TMP/$overlay.yaml" "$TMP/compat-$overlay.yaml" | head -n 40 || true
    fi
  fi
  # validate_k8s.py checks that all daemons agree; here, which way.
  tls_args="$(grep -c -e '- --tls-cert=' "$TMP/$overlay.yaml" || true)"
  case "$overlay" in
    *-tls)
      if [ "$tls_args" -ne 3 ]; then
        fail "overlay $overlay: --tls-cert on $tls_args daemons, expected the scheduler, servers and workers"
      else
        echo "ok: overlay $overlay turns mTLS on for the scheduler, the servers and the workers"
      fi ;;
    *)
      if [ "$tls_args" -ne 0 ] || grep -q -e 'fulcrum-tls' -e 'fulcrum-tokens' "$TMP/$overlay.yaml"; then
        fail "overlay $overlay: plaintext overlays must not use TLS or the Secrets (name it *-tls)"
      else
        echo "ok: overlay $overlay is plaintext and needs no Secret"
      fi ;;
  esac
done
if [ "$overlays" -eq 0 ]; then
  fail "no overlays under $K8S/overlays"
fi
if [ ! -d "$K8S/overlays/cpu-tls" ]; then
  fail "no overlay $K8S/overlays/cpu-tls"
fi

echo "== no key material in deploy/"
if grep -rIl -e '-----BEGIN [A-Z ]*PRIVATE KEY-----' -e '-----BEGIN CERTIFICATE-----' deploy/; then
  fail "key material in the files above: Secrets are created by the user (deploy/k8s/README.md)"
elif cat "$TMP"/*.yaml | grep -q '^kind: Secret$'; then
  fail "a rendered overlay holds a Secret object: Secrets are created by the user (deploy/k8s/README.md)"
else
  echo "ok: no private key, certificate or Secret object in deploy/ and the rendered overlays"
fi

# Prints the gRPC port a process wrote to its --port-file $1, polling up to
# 10 s for the file to appear; prints nothing if it never does.
port_from() {
  for _ in $(seq 1 100); do
    [ -s "$1" ] && break
    sleep 0.1
  done
  "$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["grpc_port"])' "$1" 2>/dev/null || true
}

echo "== example job spec"
if [ ${#BIN_ARGS[@]} -gt 0 ] && [ -x "$BIN_DIR/fulcrum" ]; then
  "$BIN_DIR/fulcrum-scheduler" --host=127.0.0.1 --port=0 --metrics-port=0 \
    --port-file="$TMP/scheduler.ports" >"$TMP/scheduler.log" 2>&1 &
  SCHEDULER_PID=$!
  port="$(port_from "$TMP/scheduler.ports")"
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

echo "== overlay cpu-tls: the scheduler pod's flags and CLI environment on a real scheduler"
if [ ${#BIN_ARGS[@]} -gt 0 ] && [ -x "$BIN_DIR/fulcrum" ] && command -v openssl >/dev/null 2>&1 &&
    [ -s "$TMP/cpu-tls.yaml" ]; then
  ROOTFS="$TMP/pod"
  # The Secrets as the README has them created from dev-certs.sh's output
  # (values without a trailing newline, as --from-literal "$(cat ...)" gives).
  bash scripts/dev-certs.sh "$TMP/certs" >/dev/null
  mkdir -p "$ROOTFS/etc/fulcrum/tls" "$ROOTFS/etc/fulcrum/tokens" "$ROOTFS/etc/fulcrum/job-token"
  cp "$TMP/certs/ca.crt" "$ROOTFS/etc/fulcrum/tls/ca.crt"
  cp "$TMP/certs/node.crt" "$ROOTFS/etc/fulcrum/tls/tls.crt"
  cp "$TMP/certs/node.key" "$ROOTFS/etc/fulcrum/tls/tls.key"
  printf %s "$(cat "$TMP/certs/cluster-token")" >"$ROOTFS/etc/fulcrum/tokens/cluster-token"
  printf %s "$(cat "$TMP/certs/token")" >"$ROOTFS/etc/fulcrum/job-token/token"
  if ! "$PYTHON" tests/deploy/pod_command.py "$TMP/cpu-tls.yaml" StatefulSet/fulcrum-scheduler "$ROOTFS" \
      >"$TMP/pod-env.sh"; then
    fail "tests/deploy/pod_command.py could not read the scheduler pod of overlays/cpu-tls"
  else
    health_port="$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    # In a subshell: the pod's environment stays out of this script.
    (
      # shellcheck disable=SC1091
      . "$TMP/pod-env.sh"
      CMD[0]="$BIN_DIR/${CMD[0]}"
      exec "${CMD[@]}" --host=127.0.0.1 --port=0 --metrics-port=0 --health-port="$health_port" \
        --port-file="$TMP/tls-scheduler.ports"
    ) >"$TMP/tls-scheduler.log" 2>&1 &
    TLS_SCHEDULER_PID=$!
    port="$(port_from "$TMP/tls-scheduler.ports")"
    if [ -z "$port" ]; then
      fail "the scheduler with overlays/cpu-tls's flags wrote no port file"
      cat "$TMP/tls-scheduler.log"
    else
      # cli UNSET ARGS...: the CLI with the pod's environment less the
      # variables matching the regular expression UNSET (NONE: none).
      cli() {
        local filter="$1"
        shift
        (
          # shellcheck disable=SC1091
          . "$TMP/pod-env.sh"
          for var in $(compgen -e | grep -E "^($filter)\$" || true); do unset "$var"; done
          export FULCRUM_SCHEDULER="127.0.0.1:$port" FULCRUM_LOCAL_DIR="$TMP/no-local-cluster"
          "$BIN_DIR/fulcrum" "$@"
        ) >"$TMP/cli.out" 2>&1
      }
      spec="$ROOTFS/etc/fulcrum/fashion-mnist-mlp.yaml"
      if cli NONE submit -f "$spec"; then
        echo "ok: the CLI with the pod's environment submitted $spec over mTLS (job $(cat "$TMP/cli.out"))"
      else
        fail "submit with the scheduler pod's environment: $(cat "$TMP/cli.out")"
      fi
      if cli NONE cluster; then
        echo "ok: \`fulcrum cluster\` with the pod's environment (token and cluster credential)"
      else
        fail "cluster with the scheduler pod's environment: $(cat "$TMP/cli.out")"
      fi
      if cli FULCRUM_TOKEN list; then
        fail "list without FULCRUM_TOKEN was accepted: the scheduler does not require the token"
      elif grep -q UNAUTHENTICATED "$TMP/cli.out"; then
        echo "ok: refused without FULCRUM_TOKEN ($(tr '\n' ' ' <"$TMP/cli.out"))"
      else
        fail "list without FULCRUM_TOKEN: expected UNAUTHENTICATED, got: $(cat "$TMP/cli.out")"
      fi
      if cli 'FULCRUM_TLS_.*' list; then
        fail "a plaintext client was accepted: the scheduler does not use TLS"
      else
        echo "ok: a plaintext client is refused ($(tr '\n' ' ' <"$TMP/cli.out"))"
      fi
      if "$PYTHON" -c 'import socket, sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 2).close()' \
          "$health_port" 2>/dev/null; then
        echo "ok: the health port (--health-port) accepts connections"
      else
        fail "nothing listens on --health-port=$health_port"
        cat "$TMP/tls-scheduler.log"
      fi
    fi
    kill "$TLS_SCHEDULER_PID" 2>/dev/null || true
    wait "$TLS_SCHEDULER_PID" 2>/dev/null || true
    TLS_SCHEDULER_PID=""
  fi
else
  echo "not checked: needs the binaries in $BIN_DIR, openssl and a rendered overlays/cpu-tls"
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
