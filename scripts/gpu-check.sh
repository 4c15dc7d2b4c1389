#!/usr/bin/env bash
# Runs on the GPU machine from the repository root, with .gpu-bundle/ (made by
# scripts/gpu-bundle.sh) beside it. In one go: the CUDA backend test suite,
# the demo job with the workers on the GPU and on the CPU (test accuracy side
# by side), the worker-step benchmark against PyTorch eager, and training
# steps/s on GPU workers by wire format and push overlap (fulcrum-train-bench). Logs go to
# $OUT (or ./gpu-check-out); a short table is printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
CARRIED="$ROOT/.gpu-bundle"
OUT="${OUT:-$ROOT/gpu-check-out}"
mkdir -p "$OUT"
# Unpack the programs (scripts/gpu-bundle.sh packs them) next to a copy of
# the rest, outside the carried folder.
BUNDLE="${TMPDIR:-/tmp}/fulcrum-gpu-bundle"
rm -rf "$BUNDLE"
mkdir -p "$BUNDLE"
if ! tar -C "$BUNDLE" -xzf "$CARRIED/programs.tar.gz"; then
  echo "gpu-check: cannot unpack $CARRIED/programs.tar.gz (run scripts/gpu-bundle.sh and carry .gpu-bundle)" >&2
  exit 1
fi
cp -r "$CARRIED/data" "$CARRIED/bench" "$CARRIED/examples" "$BUNDLE/"
CUDA_LIB="$(ls -d /usr/local/cuda-13*/targets/x86_64-linux/lib /usr/local/cuda/targets/x86_64-linux/lib 2>/dev/null | head -1)"
export LD_LIBRARY_PATH="$BUNDLE/lib:$CUDA_LIB:${LD_LIBRARY_PATH:-}"
export FULCRUM_BIN_DIR="$BUNDLE/bin"
export FULCRUM_CUDA_PLUGIN="$BUNDLE/lib/libfulcrum_kernels_cuda.so"
FULCRUM="$BUNDLE/bin/fulcrum"
STEPS="${GPU_CHECK_STEPS:-50}"

nvidia-smi -L > "$OUT/gpu.txt" 2>&1 || true
cat "$OUT/gpu.txt"

echo "== CUDA backend tests" >&2
"$BUNDLE/bin/kernels_test" > "$OUT/kernels_test.log" 2>&1
TEST_RC=$?
TEST_SUMMARY="$(grep -E '^\[  (PASSED|FAILED)  \]|tests? skipped|SKIPPED \]' "$OUT/kernels_test.log" | tail -3 | tr '\n' ' ')"
CUDA_SKIPS="$(grep '\[  SKIPPED \].*cuda' "$OUT/kernels_test.log" | sort -u | wc -l)"

run_job() {  # device -> prints the test accuracy
  local device="$1" dir="/tmp/fulcrum-gpu-check-$1"
  rm -rf "$dir"
  "$FULCRUM" local up --servers 2 --workers 2 --device "$device" --dir "$dir" --detach > "$OUT/cluster-$device.txt" 2>&1 || return 1
  sed "s#BUNDLE#$BUNDLE#" "$BUNDLE/examples/fashion-mnist-mlp.yaml" > "$dir/job.yaml"
  timeout 600 "$FULCRUM" submit -f "$dir/job.yaml" --wait -o json --dir "$dir" > "$OUT/job-$device.json" 2> "$OUT/job-$device.err"
  local rc=$?
  cp -r "$dir/logs" "$OUT/logs-$device" 2>/dev/null
  "$FULCRUM" local down --dir "$dir" > /dev/null 2>&1
  [ $rc -eq 0 ] || return 1
  # The first testAccuracy is the job's progress (the history follows it).
  grep -o '"testAccuracy": [0-9.]*' "$OUT/job-$device.json" | head -1 | awk '{print $2}'
}
echo "== demo job on the GPU" >&2
GPU_ACC="$(run_job cuda || echo FAILED)"
echo "== demo job on the CPU" >&2
CPU_ACC="$(run_job cpu || echo FAILED)"

echo "== worker-step benchmark" >&2
"$BUNDLE/bin/fulcrum-gpu-bench" --device cuda:0 --steps "$STEPS" > "$OUT/bench-fulcrum.txt" 2> "$OUT/bench-fulcrum.err"
python3 "$BUNDLE/bench/torch_step_bench.py" --steps "$STEPS" > "$OUT/bench-torch.txt" 2> "$OUT/bench-torch.err"

echo "== training steps/s on GPU workers: wire formats, streamed pushes" >&2
timeout 300 "$BUNDLE/bin/fulcrum-train-bench" --device cuda --steps 60 --rounds 1 > "$OUT/train-bench.txt" 2>&1

{
  echo
  echo "GPU check ($(head -1 "$OUT/gpu.txt"))"
  echo "kernels_test: exit $TEST_RC; $TEST_SUMMARY; CUDA tests skipped: $CUDA_SKIPS"
  echo "fashion-mnist-mlp test accuracy: GPU workers $GPU_ACC, CPU workers $CPU_ACC"
  echo
  printf "%-28s %-5s %14s %14s %8s %9s %8s\n" model prec fulcrum_sps torch_sps ratio TFLOP/s ceiling
  while read -r _ model prec sps tflops frac; do
    tsps="$(awk -v m="$model" -v p="$prec" '$2==m && $3==p {print $4}' "$OUT/bench-torch.txt")"
    ratio="$(awk -v a="$sps" -v b="${tsps:-0}" 'BEGIN {if (b > 0) printf "%.2f", a / b; else print "-"}')"
    printf "%-28s %-5s %14s %14s %8s %9s %8s\n" "$model" "$prec" "$sps" "${tsps:--}" "$ratio" "$tflops" "$frac"
  done < "$OUT/bench-fulcrum.txt"
  echo
  grep -E '^\||^BSP' "$OUT/train-bench.txt" || echo "fulcrum-train-bench: no table (see train-bench.txt)"
} | tee "$OUT/summary.txt"
