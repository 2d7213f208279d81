#!/usr/bin/env bash
# The CUDA backend's validation on a GPU machine (issue 14), in one run of about 6-8 minutes:
#   1. environment: nvidia-smi, torch / Triton / transformers versions;
#   2. install: the carried wheels pytgi needs and the machine lacks (.gpu-wheels/, made by
#      scripts/gpu_wheels.sh where PyPI is reachable), then `pip install --no-deps -e .`;
#   3. a random-weight Llama-3.2-1B-shaped checkpoint in bf16 (scripts/make_smollm_shaped.py);
#   4. the `gpu`-marked tests: fp32 greedy parity with transformers per tiny architecture (CUDA
#      graphs on, and off for three), bf16 logits / top-1 agreement (tiny and 1B-shaped), graph
#      replay vs eager, KV sizing after capture, generate / serve end to end, sampling on device;
#   5. `pytgi bench` on the 1B-shaped model in bf16, graphs on: batch-1 decode as a fraction of
#      the copy-bandwidth bound (target >= 0.6), batches 16 and 64 against transformers' static
#      batching (target >= 3x);
#   6. the same benchmark with CUDA_GRAPHS=0 (pytgi only): graphs on versus off.
# Every phase has its own time limit and log; results land under $OUT (default ./gpu-results):
# phases.txt, SUMMARY.md, *.log, junit.xml, tests/*.json (figures the tests measured),
# bench_{graphs,eager}.{json,md}.
#
#   bash scripts/gpu_validate.sh              # everything
#   bash scripts/gpu_validate.sh tests        # phases 1-4 only; `bench`: 1-3, 5-6
# Env: OUT, PYTHON (default python, else python3), PYTGI_WHEELS (default .gpu-wheels), PYTGI_GPU_WORK (scratch
# for the 1B checkpoint, default /tmp/pytgi-gpu; reused when already there), PYTEST_ARGS (extra
# pytest arguments, e.g. "-k parity" to rerun a subset).
set -uo pipefail
cd "$(dirname "$0")/.."
what="${1:-all}"
OUT="${OUT:-$PWD/gpu-results}"
PY="${PYTHON:-$(command -v python || command -v python3)}"
WHEELS="${PYTGI_WHEELS:-.gpu-wheels}"
WORK="${PYTGI_GPU_WORK:-/tmp/pytgi-gpu}"
MODEL_1B="$WORK/llama-3.2-1b-shaped"
mkdir -p "$OUT" "$WORK"
export PYTHONPATH="$PWD" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_WAIT_POLICY=PASSIVE
export PYTGI_GPU_RESULTS="$OUT/tests" OUT PY WHEELS MODEL_1B

phase() {  # phase NAME LIMIT_S FUNCTION [ARGS...]: run with a time limit, log to $OUT/NAME.log
  local name=$1 limit=$2 start rc
  shift 2
  start=$(date +%s)
  timeout --kill-after=10 "$limit" bash -c '"$@"' _ "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  echo "$name: exit $rc after $(($(date +%s) - start)) s (limit $limit s)" | tee -a "$OUT/phases.txt"
  return $rc
}

environment() {
  nvidia-smi
  "$PY" -c '
import sys, torch, triton, transformers
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      "triton", triton.__version__, "transformers", transformers.__version__)
print("device", torch.cuda.get_device_name(), "free/total bytes", torch.cuda.mem_get_info())'
}

install() {
  local missing
  missing=$("$PY" -c '
import importlib.util
needed = {"fastapi": "fastapi", "uvicorn": "uvicorn", "httpx": "httpx", "pydantic": "pydantic",
          "prometheus_client": "prometheus_client", "jinja2": "Jinja2", "tqdm": "tqdm",
          "pytest": "pytest", "safetensors": "safetensors", "tokenizers": "tokenizers",
          "huggingface_hub": "huggingface_hub"}
print(" ".join(p for m, p in needed.items() if importlib.util.find_spec(m) is None))')
  if [[ -n "$missing" ]]; then
    echo "installing from $WHEELS: $missing"
    # shellcheck disable=SC2086
    "$PY" -m pip install --no-index --find-links "$WHEELS" $missing || return 1
  fi
  # editable, without touching the machine's torch (PYTHONPATH covers a failure here)
  "$PY" -m pip install --no-deps --no-build-isolation -e . || echo "editable install failed"
  "$PY" -c "import pytgi, fastapi, uvicorn, httpx, pytest; print('pytgi at', pytgi.__file__)"
}

make_model() {
  if [[ -f "$MODEL_1B/config.json" ]]; then
    echo "reusing $MODEL_1B"
    return 0
  fi
  "$PY" scripts/make_smollm_shaped.py "$MODEL_1B" --shape llama-3.2-1b --dtype bfloat16 \
    --device cuda
}

gpu_tests() {
  # shellcheck disable=SC2086
  "$PY" -m pytest -m gpu -p no:cacheprovider -v -rfE --durations=25 \
    --junitxml="$OUT/junit.xml" ${PYTEST_ARGS:-} tests/backends/cuda \
    tests/sampling/test_sampler_cuda.py
}

bench() {  # bench NAME [extra pytgi bench args]; NAME eager runs with CUDA_GRAPHS=0
  local name=$1
  shift
  if [[ $name == eager ]]; then export CUDA_GRAPHS=0; fi
  "$PY" -m pytgi bench --model-id "$MODEL_1B" --dtype bfloat16 --workload decode1 \
    --batch-sizes 16,64 --prompt-lengths 128 --output-lengths 128 --sequential-sample 2 \
    --output "$OUT/bench_$name.json" --markdown "$OUT/bench_$name.md" "$@"
}

summary() {
  "$PY" scripts/gpu_summary.py "$OUT"
}

export -f environment install make_model gpu_tests bench summary

: >"$OUT/phases.txt"
phase environment 60 environment
phase install 90 install || echo "install failed: see $OUT/install.log"
phase model_1b 120 make_model && export PYTGI_GPU_MODEL_1B="$MODEL_1B"
if [[ "$what" != bench ]]; then
  phase tests 270 gpu_tests
fi
if [[ "$what" != tests && -f "$MODEL_1B/config.json" ]]; then
  phase bench_graphs 150 bench graphs --baselines hf_sequential,hf_static
  phase bench_eager 75 bench eager --no-baseline
fi
phase summary 30 summary
cat "$OUT/SUMMARY.md" 2>/dev/null
echo "results in $OUT"
