#!/usr/bin/env bash
# pytgi against llama.cpp on the same GGUF files (issue 22's table): one command once llama.cpp is
# built (scripts/build_llamacpp.sh). All the work is scripts/bench_issue22.py (its docstring says
# what it measures); this only runs it from the repository root.
#   scripts/bench_issue22.sh --quick     # SmolLM2 Q8_0/Q4_0/Q4_K_M + 1B Q4_K_M, 1 round
#   scripts/bench_issue22.sh             # both models x 3 types, 2 rounds
#   scripts/bench_issue22.sh --smoke     # checks that everything runs (SmolLM2 Q8_0, few tokens)
set -euo pipefail
cd "$(dirname "$0")/.."
exec python scripts/bench_issue22.py "$@"
