#!/usr/bin/env bash
# Sweep the step token budget (--max-batch-prefill-tokens) for CPU serving: for each value, start
# `pytgi serve` on the demo model, send one warm-up burst, then measure a burst of 16 concurrent
# 256-token prompts (128 new tokens each, greedy) with `pytgi bench --url`. Values are interleaved
# over ROUNDS rounds (the second in reverse order) so drift on a shared machine hits all of them.
# Usage: scripts/cpu_prefill_sweep.sh OUT_DIR [VALUES] [ROUNDS]   (results: OUT_DIR/<value>-r<n>/)
set -euo pipefail
out=${1:?output directory}
values=(${2:-4096 2048 1024 512 256})
rounds=${3:-2}
port=${PORT:-3917}
demo=$(python -c "from pytgi.demo_model import demo_model_path; print(demo_model_path())")
bench=(python -m pytgi bench --url "http://127.0.0.1:$port" --api tgi --tokenizer-name "$demo"
       --prompt-tokens 256 --output-tokens 128 --concurrency 16 --max-requests 16
       --warmup-requests 0 --duration 300 --request-timeout 300 --no-progress --no-plots)
for round in $(seq 1 "$rounds"); do
  order=("${values[@]}")
  if (( round % 2 == 0 )); then order=($(printf '%s\n' "${values[@]}" | tac)); fi
  for value in "${order[@]}"; do
    dir="$out/$value-r$round"
    mkdir -p "$dir"
    python -m pytgi serve --port "$port" --hostname 127.0.0.1 \
      --max-batch-prefill-tokens "$value" > "$dir/server.log" 2>&1 &
    server=$!
    until curl -sf "http://127.0.0.1:$port/health" > /dev/null; do sleep 0.5; done
    "${bench[@]}" --seed 1 --output-dir "$dir/warmup" > /dev/null
    cat /proc/loadavg > "$dir/loadavg-before"
    "${bench[@]}" --seed 2 --output-dir "$dir/burst" > "$dir/bench.txt"
    cat /proc/loadavg > "$dir/loadavg-after"
    kill -TERM "$server"
    wait "$server" || true
  done
done
