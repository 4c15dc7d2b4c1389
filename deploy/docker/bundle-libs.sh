#!/usr/bin/env bash
# bundle-libs.sh DEST FILE...: copies into DEST every shared library the
# given executables and libraries load (ldd), except the C runtime (glibc,
# libstdc++, libgcc_s), which the target image brings, and CUDA's (driver,
# cudart, cuBLAS), which the nvidia/cuda runtime image and the NVIDIA
# container runtime bring. Used by fulcrum-worker-gpu.Dockerfile to carry the
# Debian 12 libraries (gRPC, Abseil, OpenBLAS, ...) onto the Ubuntu-based
# CUDA runtime image, as scripts/gpu-bundle.sh does for the GPU machine.
set -euo pipefail
dest="$1"
shift
mkdir -p "$dest"
SKIP='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libstdc\+\+|libgcc_s|libcuda\.so|libcudart|libcublas|libcublasLt)'
for f in "$@"; do
  ldd "$f" | awk '/=>/ {print $1, $3}'
done | sort -u | while read -r name path; do
  if echo "$name" | grep -Eq "$SKIP"; then continue; fi
  if [ ! -f "$path" ]; then
    echo "bundle-libs: $name is needed but not found" >&2
    exit 1
  fi
  cp -L "$path" "$dest/$name"
done
strip --strip-unneeded "$dest"/* 2>/dev/null || true
ls "$dest" >&2
