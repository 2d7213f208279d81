#!/usr/bin/env bash
# pytgi against llama.cpp on the same GGUF files, same threads, one run (docs/PERFORMANCE.md,
# "Against llama.cpp"). Each server alone on the machine, started, measured, stopped in turn.
#   scripts/bench_vs_llamacpp.sh http1|http16|engine|memory OUT_DIR FILE...
# http1: batch-1 decode streamed over HTTP (32-token prompts, 128 out, 8 measured requests);
# http16: 16 concurrent clients (256-token prompts, 128 out, 48 measured requests);
# engine: `pytgi bench --model-id FILE --workload decode1` beside `llama-bench -n 128` (tg128);
# memory: each server's resident set after warm-up (in every mode: rss.tsv), with a KV cache of
# 1024 tokens each (llama-server -c 1024, pytgi --num-blocks 64; in the other modes pytgi sizes
# its cache from the free memory, as it serves).
# Env: LLAMA_BIN (default /work/llama.cpp/build/bin), THREADS (2).
set -euo pipefail
mode=$1 out=$2; shift 2
LLAMA_BIN=${LLAMA_BIN:-/work/llama.cpp/build/bin}
THREADS=${THREADS:-2}
PORT=${PORT:-18431}
mkdir -p "$out"
log() { echo "== $* $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/run.log"; }

wait_healthy() {  # url pid
  for _ in $(seq 1 600); do
    kill -0 "$2" 2>/dev/null || { echo "server $2 exited" >&2; return 1; }
    curl -sf "$1/health" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  return 1
}

rss_mib() {  # pid and its children: resident MiB, "pid:MiB" each
  local total=0 parts=""
  for p in "$1" $(pgrep -P "$1" || true); do
    local kb; kb=$(awk '/VmRSS/ {print $2}' "/proc/$p/status" 2>/dev/null || echo 0)
    total=$((total + kb)); parts="$parts $(cat /proc/$p/comm):$((kb / 1024))"
  done
  echo "$((total / 1024))	$parts"
}

start_server() {  # kind file -> sets SERVER_PID, URL
  URL="http://127.0.0.1:$PORT"
  if [ "$1" = llama ]; then
    local slots=1 ctx=4096
    [ "$mode" = http16 ] && slots=16 ctx=16384
    [ "$mode" = memory ] && ctx=1024
    "$LLAMA_BIN/llama-server" -m "$2" --host 127.0.0.1 --port "$PORT" -t "$THREADS" -tb "$THREADS" \
      -np "$slots" -c "$ctx" >"$out/server-$1-$(basename "$2").log" 2>&1 &
  else
    local kv=()
    [ "$mode" = memory ] && kv=(--num-blocks 64 --block-size 16)
    python -m pytgi serve --model-id "$2" --hostname 127.0.0.1 --port "$PORT" \
      --num-threads "$THREADS" "${kv[@]}" >"$out/server-$1-$(basename "$2").log" 2>&1 &
  fi
  SERVER_PID=$!
  wait_healthy "$URL" "$SERVER_PID"
}

stop_server() {
  kill -TERM "$SERVER_PID" 2>/dev/null || true
  wait "$SERVER_PID" 2>/dev/null || true
}

tokenizer_dir() {  # pytgi's prepared directory of a GGUF file (its tokenizer.json)
  python -c "import sys; from pytgi.models.resolve import resolve_model; from pytgi.runtime.build import engine_config; print(resolve_model(engine_config(sys.argv[1]).model))" "$1"
}

http_bench() {  # kind file
  local name="$1-$(basename "$2" .gguf)" tok; tok=$(tokenizer_dir "$2")
  local load=(--concurrency 1 --prompt-tokens 32 --output-tokens 128 --max-requests 8
              --warmup-requests 1)
  [ "$mode" = http16 ] && load=(--concurrency 16 --prompt-tokens 256 --output-tokens 128
                                --max-requests 48 --warmup-requests 16)
  python -m pytgi bench --url "$URL" --api completions --tokenizer-name "$tok" --ignore-eos \
    "${load[@]}" --duration 300 --no-plots --no-progress --name "$name" \
    --output-dir "$out/$name" >"$out/$name.txt" 2>&1
}

for file in "$@"; do
  case $mode in
    http1|http16|memory)
      for kind in llama pytgi; do
        log "$mode $kind $(basename "$file") start"
        start_server "$kind" "$file"
        echo "$kind	$(basename "$file")	$(rss_mib "$SERVER_PID")" | tee -a "$out/rss.tsv"
        [ "$mode" = memory ] || http_bench "$kind" "$file"
        echo "$kind	$(basename "$file")	after	$(rss_mib "$SERVER_PID")" | tee -a "$out/rss.tsv"
        stop_server
        log "$mode $kind $(basename "$file") done"
      done ;;
    engine)
      name=$(basename "$file" .gguf)
      log "engine pytgi $name"
      python -m pytgi bench --model-id "$file" --workload decode1 --num-threads "$THREADS" \
        --no-baseline --repeats 3 --output "$out/engine-$name.json" \
        --markdown "$out/engine-$name.md" >"$out/engine-$name.txt" 2>&1
      log "engine llama-bench $name"
      "$LLAMA_BIN/llama-bench" -m "$file" -p 0 -n 128 -t "$THREADS" -r 3 -o md \
        >"$out/llama-bench-$name.md" 2>"$out/llama-bench-$name.err"
      log "engine $name done" ;;
  esac
done
log DONE
