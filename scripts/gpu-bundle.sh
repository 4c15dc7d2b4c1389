#!/usr/bin/env bash
# Builds Fulcrum (Release, CUDA for sm_90) and bundles what the GPU machine
# needs into .gpu-bundle/ (ignored by git), per ../shared/GPU.md: binaries,
# the CUDA plugin, test binaries, every non-system shared library they use
# (not CUDA's, which the GPU machine has; binaries and libraries packed in
# programs.tar.gz), Fashion-MNIST, and the PyTorch peer benchmark. Fails when
# the bundle and the working tree would not fit in one device call. Then: run
# `scripts/gpu-check.sh` there with .gpu-bundle carried.
#
# OpenBLAS (35 MB) does not fit the 64 MiB a device call may carry, so the
# bundle ships Debian's 450 KB reference BLAS under OpenBLAS's file name: it
# has the same CBLAS ABI, and on the GPU machine the CPU backend only runs the
# CPU side of the accuracy comparison.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
BUNDLE="$ROOT/.gpu-bundle"
BUILD_DIR="${FULCRUM_BUILD_DIR:-build}"

./scripts/install-deps.sh
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 >&2
cmake --build "$BUILD_DIR" -j "$(nproc)" >&2
if [ ! -f "$BUILD_DIR/lib/libfulcrum_kernels_cuda.so" ]; then
  echo "gpu-bundle: the CUDA plugin was not built (no CUDA toolkit?)" >&2
  exit 1
fi

rm -rf "$BUNDLE"
mkdir -p "$BUNDLE/bin" "$BUNDLE/lib" "$BUNDLE/data/fashion-mnist" "$BUNDLE/bench" "$BUNDLE/examples"
BINARIES=(fulcrum fulcrum-scheduler fulcrum-server fulcrum-worker fulcrum-gpu-bench fulcrum-train-bench kernels_test
          ctr_model_test fulcrum-ctr-model-bench)
for b in "${BINARIES[@]}"; do cp "$BUILD_DIR/bin/$b" "$BUNDLE/bin/"; done
cp "$BUILD_DIR/lib/libfulcrum_kernels_cuda.so" "$BUNDLE/lib/"

# Shared libraries the binaries and the plugin need, less the system's and CUDA's.
SKIP='^(linux-vdso|libc\.so|libm\.so|libstdc\+\+|libgcc_s|ld-linux|libpthread|libdl|librt|libcuda|libcudart|libcublas|libcublasLt|libopenblas|libgfortran|libquadmath)'
for f in "$BUNDLE"/bin/* "$BUNDLE"/lib/libfulcrum_kernels_cuda.so; do
  ldd "$f" | awk '/=>/ {print $1, $3}'
done | sort -u | while read -r name path; do
  if echo "$name" | grep -Eq "$SKIP"; then continue; fi
  # (an `if`: a last library not found must not end the script under set -e)
  if [ -f "$path" ]; then cp -L "$path" "$BUNDLE/lib/$name"; fi
done
cp -L /usr/lib/x86_64-linux-gnu/blas/libblas.so.3 "$BUNDLE/lib/libopenblas.so.0"
strip --strip-unneeded "$BUNDLE"/bin/* "$BUNDLE"/lib/* 2>/dev/null || true

cp /usr/share/datasets/fashion-mnist/*.gz "$BUNDLE/data/fashion-mnist/"
cp bench/torch_step_bench.py "$BUNDLE/bench/"
sed "s#path: /usr/share/datasets/fashion-mnist#path: BUNDLE/data/fashion-mnist#" examples/fashion-mnist-mlp.yaml \
  > "$BUNDLE/examples/fashion-mnist-mlp.yaml"
cp examples/ctr-synthetic.yaml "$BUNDLE/examples/"

# Programs and libraries travel as one gzip'ed tar (42 MB -> 16 MB): a device
# call carries at most 64 MiB, working tree included. gpu-check.sh unpacks it.
tar -C "$BUNDLE" -czf "$BUNDLE/programs.tar.gz" bin lib
rm -rf "$BUNDLE/bin" "$BUNDLE/lib"

bytes="$(du -sb "$BUNDLE" | cut -f1)"
tree="$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)"
limit=$((60 << 20))
echo "bundle: $bytes bytes, working tree $tree bytes (a device call carries 64 MiB in all)" >&2
if [ $((bytes + tree)) -gt "$limit" ]; then
  echo "gpu-bundle: bundle and tree exceed 60 MiB; a device call would not carry them" >&2
  exit 1
fi
echo "bundle ready in $BUNDLE ($(find "$BUNDLE" -type f | wc -l) files)" >&2
