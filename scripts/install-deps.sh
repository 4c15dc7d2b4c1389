#!/usr/bin/env bash
# Installs the Debian 12 packages Fulcrum builds and runs with, if any is
# missing. Debian packages only: nothing is downloaded from elsewhere.
set -euo pipefail

PACKAGES=(
  g++ cmake ninja-build pkg-config ccache curl
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev librocksdb-dev prometheus-cpp-dev libopenblas-dev
  libyaml-cpp-dev zlib1g-dev libgtest-dev libgmock-dev libbenchmark-dev
  dataset-fashion-mnist
  python3-numpy  # tests: cross-check exported safetensors files
  prometheus yamllint  # tests: promtool check metrics / test rules, a real Prometheus, YAML lint
  openssl  # scripts/dev-certs.sh (local up --tls)
  clang clang-tidy libclang-rt-dev  # scripts/checks.sh: -Wthread-safety, ASan/UBSan/TSan, libFuzzer, clang-tidy
  python3-kubernetes  # tests: Kubernetes API schemas (tests/deploy/validate_k8s.py)
  # tests: kubectl with kustomize (tests/deploy/check_k8s.sh), unless another
  # package (e.g. google-cloud-sdk's kubectl) already provides /usr/bin/kubectl
  $(command -v kubectl >/dev/null 2>&1 || echo kubernetes-client)
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "installing: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get install -y --no-install-recommends "${missing[@]}" >&2; then
  $SUDO apt-get update >&2
  $SUDO apt-get install -y --no-install-recommends "${missing[@]}" >&2
fi
