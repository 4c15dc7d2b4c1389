#!/usr/bin/env bash
# Runs on the GPU machine from the repository root, with .gpu-bundle/ (made by
# scripts/gpu-bundle.sh) beside it. In one go: the CUDA backend test suite,
# the click models' graph on the CUDA backend against the host, the demo job
# and the DeepFM click job with the workers on the GPU and on the CPU (test
# accuracy and AUC side by side), the click model step by compute path, the worker-step benchmark against PyTorch eager, and training
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

echo "== click models on the CUDA backend (GraphModel against the host)" >&2
"$BUNDLE/bin/ctr_model_test" --gtest_filter='*GraphOnBackend*' > "$OUT/ctr_model_test.log" 2>&1
CLICK_TEST_RC=$?
CLICK_TEST_SUMMARY="$(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/ctr_model_test.log" | tail -2 | tr '\n' ' ')"
CLICK_CUDA_SKIPS="$(grep '\[  SKIPPED \].*cuda' "$OUT/ctr_model_test.log" | sort -u | wc -l)"
run_job() {  # device example metric -> prints the metric of the job's progress
  local device="$1" example="$2" metric="$3" dir="/tmp/fulcrum-gpu-check-$1-$2"
  rm -rf "$dir"
  "$FULCRUM" local up --servers 2 --workers 2 --device "$device" --dir "$dir" --detach > "$OUT/cluster-$device-$example.txt" 2>&1 || return 1
  sed "s#BUNDLE#$BUNDLE#" "$BUNDLE/examples/$example.yaml" > "$dir/job.yaml"
  timeout 600 "$FULCRUM" submit -f "$dir/job.yaml" --wait -o json --dir "$dir" > "$OUT/job-$device-$example.json" 2> "$OUT/job-$device-$example.err"
  local rc=$?
  cp -r "$dir/logs" "$OUT/logs-$device-$example" 2>/dev/null
  "$FULCRUM" local down --dir "$dir" > /dev/null 2>&1
  [ $rc -eq 0 ] || return 1
  # The first one is the job's progress (the history follows it).
  grep -o "\"$metric\": [0-9.]*" "$OUT/job-$device-$example.json" | head -1 | awk '{print $2}'
}
echo "== demo job on the GPU" >&2
GPU_ACC="$(run_job cuda fashion-mnist-mlp testAccuracy || echo FAILED)"
echo "== demo job on the CPU" >&2
CPU_ACC="$(run_job cpu fashion-mnist-mlp testAccuracy || echo FAILED)"
echo "== click job (DeepFM, examples/ctr-synthetic.yaml) on the GPU and on the CPU" >&2
GPU_AUC="$(run_job cuda ctr-synthetic testAuc || echo FAILED)"
CPU_AUC="$(run_job cpu ctr-synthetic testAuc || echo FAILED)"
echo "== click model step: fused, host graph, graph on the GPU" >&2
"$BUNDLE/bin/fulcrum-ctr-model-bench" --device=cuda:0 --benchmark_min_time=0.3 > "$OUT/ctr-model-bench.txt" 2>&1

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
  echo "click models on CUDA (ctr_model_test GraphOnBackend): exit $CLICK_TEST_RC; $CLICK_TEST_SUMMARY; CUDA tests skipped: $CLICK_CUDA_SKIPS"
  echo "ctr-synthetic (DeepFM) test AUC: GPU workers $GPU_AUC, CPU workers $CPU_AUC"
  grep -E '_median' "$OUT/ctr-model-bench.txt" | awk '{print "  " $1, $2, $3}' || true
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
