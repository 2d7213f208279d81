#!/usr/bin/env bash
# The CUDA backend's validation on a GPU machine, in one run of at most 6.5 minutes (the phase
# limits add up to 390 s; a phase past its limit is killed and the next one starts):
#   1. environment (20 s): nvidia-smi, torch / Triton / transformers versions;
#   2. install (35 s): the carried wheels (.gpu-wheels/, scripts/gpu_wheels.sh: transformers and
#      tokenizers at this project's versions, the server's dependencies) into /tmp/site, first on
#      PYTHONPATH after the repository; nothing of the machine's own packages is touched;
#   3. features (120 s): tests/backends/cuda/test_gpu_features.py (pre-quantized GPTQ / AWQ /
#      compressed-tensors / FP8 checkpoints from .gpu-fixtures/, made by scripts/gpu_fixtures.py;
#      MoE and MLA; Qwen2-VL with images; LoRA; bfloat16 / fp8 KV caches with CUDA graphs) and the
#      Triton kernels' own tests on the device (test_quant_ops.py, test_triton_ops.py);
#   4. tests (120 s): the earlier `gpu` tests (fp32 greedy parity per tiny architecture with and
#      without CUDA graphs, bf16 logits, graph replay, KV sizing, generate / serve, sampling);
#   5. model_1b (40 s): a random-weight Llama-3.2-1B-shaped bf16 checkpoint;
#   6. bench (45 s): `pytgi bench` on it, graphs on, once (batch-1 decode against the copy-
#      bandwidth bound, batch 16 against transformers' static batching);
#   7. summary (10 s).
# $OUT (default ./gpu-results) receives at most 5 files: phases.txt, gpu.log (every phase's log,
# appended as each ends), junit.xml (both test phases), SUMMARY.md, bench_graphs.md. Scratch
# (logs, measured figures, the 1B checkpoint) lives in PYTGI_GPU_WORK (default /tmp/pytgi-gpu).
#
#   bash scripts/gpu_validate.sh            # everything
#   bash scripts/gpu_validate.sh tests      # phases 1-4 and 7 only
# Env: OUT, PYTHON (default python3), PYTGI_WHEELS (default .gpu-wheels), PYTGI_GPU_FIXTURES
# (default .gpu-fixtures), PYTGI_GPU_WORK, PYTEST_ARGS (extra pytest arguments, e.g. "-k gptq").
set -uo pipefail
cd "$(dirname "$0")/.."
what="${1:-all}"
OUT="${OUT:-$PWD/gpu-results}"
PY="${PYTHON:-$(command -v python3 || command -v python)}"
WHEELS="${PYTGI_WHEELS:-.gpu-wheels}"
WORK="${PYTGI_GPU_WORK:-/tmp/pytgi-gpu}"
SITE="$WORK/site"
MODEL_1B="$WORK/llama-3.2-1b-shaped"
mkdir -p "$OUT" "$WORK/logs"
export PYTHONPATH="$PWD:$SITE" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_WAIT_POLICY=PASSIVE
export PYTGI_GPU_RESULTS="$WORK/tests" PYTGI_GPU_FIXTURES="${PYTGI_GPU_FIXTURES:-$PWD/.gpu-fixtures}"
export OUT PY WHEELS WORK SITE MODEL_1B

phase() {  # phase NAME LIMIT_S FUNCTION [ARGS...]: run with a time limit; log appended to gpu.log
  local name=$1 limit=$2 start rc log="$WORK/logs/$1.log"
  shift 2
  start=$(date +%s)
  timeout --kill-after=5 "$limit" bash -c '"$@"' _ "$@" >"$log" 2>&1
  rc=$?
  echo "$name: exit $rc after $(($(date +%s) - start)) s (limit $limit s)" | tee -a "$OUT/phases.txt"
  { echo "===== $name (exit $rc) ====="; tail -n 4000 "$log"; } >>"$OUT/gpu.log"
  return $rc
}

environment() {
  nvidia-smi
  "$PY" -c '
import sys, torch, triton, transformers, tokenizers
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      "triton", triton.__version__, "transformers", transformers.__version__,
      "tokenizers", tokenizers.__version__)
print("device", torch.cuda.get_device_name(), "capability", torch.cuda.get_device_capability(),
      "free/total bytes", torch.cuda.mem_get_info())'
  ls "$WHEELS" | wc -l
  ls "$PYTGI_GPU_FIXTURES"
}

install() {
  rm -rf "$SITE"
  if ! "$PY" -m pip install -q --no-index --no-deps --target "$SITE" "$WHEELS"/*.whl; then
    echo "pip failed: unpacking the wheels instead"  # a wheel is an importable zip of its files
    rm -rf "$SITE" && mkdir -p "$SITE"
    for wheel in "$WHEELS"/*.whl; do "$PY" -m zipfile -e "$wheel" "$SITE" || return 1; done
  fi
  "$PY" -c '
import fastapi, uvicorn, httpx, pydantic, pytest, transformers, tokenizers, peft, llguidance, pytgi
print("transformers", transformers.__version__, transformers.__file__)
print("tokenizers", tokenizers.__version__, "peft", peft.__version__, "pytgi at", pytgi.__file__)
assert transformers.__version__ == "4.57.6", "the carried transformers is not the one imported"'
}

features() {
  # shellcheck disable=SC2086
  "$PY" -m pytest -m "gpu or not gpu" -p no:cacheprovider -v -rfEs --durations=15 \
    --junitxml="$WORK/junit_features.xml" ${PYTEST_ARGS:-} \
    tests/backends/cuda/test_gpu_features.py tests/backends/cuda/test_quant_ops.py \
    tests/backends/cuda/test_triton_ops.py
}

gpu_tests() {
  # shellcheck disable=SC2086
  "$PY" -m pytest -m gpu -p no:cacheprovider -v -rfEs --durations=15 \
    --junitxml="$WORK/junit_tests.xml" ${PYTEST_ARGS:-} tests/backends/cuda \
    --ignore=tests/backends/cuda/test_gpu_features.py tests/sampling/test_sampler_cuda.py
}

make_model() {
  if [[ -f "$MODEL_1B/config.json" ]]; then
    echo "reusing $MODEL_1B"
    return 0
  fi
  "$PY" scripts/make_smollm_shaped.py "$MODEL_1B" --shape llama-3.2-1b --dtype bfloat16 \
    --device cuda
}

bench() {
  "$PY" -m pytgi bench --model-id "$MODEL_1B" --dtype bfloat16 --workload decode1 \
    --batch-sizes 16 --prompt-lengths 128 --output-lengths 64 --sequential-sample 1 \
    --baselines hf_static --output "$WORK/bench_graphs.json" --markdown "$OUT/bench_graphs.md"
}

summary() {
  "$PY" scripts/gpu_summary.py "$OUT" "$WORK"
}

export -f environment install features gpu_tests make_model bench summary

: >"$OUT/phases.txt"
: >"$OUT/gpu.log"
phase environment 20 environment
phase install 60 install || echo "install failed: see gpu.log"
phase features 180 features
phase tests 150 gpu_tests
if [[ "$what" != tests ]]; then
  phase model_1b 40 make_model && phase bench 45 bench
fi
phase summary 10 summary
cat "$OUT/SUMMARY.md" 2>/dev/null
echo "results in $OUT"
