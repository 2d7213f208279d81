#!/usr/bin/env bash
# The llama.cpp build the GGUF benchmarks compare pytgi against (docs/PERFORMANCE.md, "Quantized
# serving against llama.cpp"). No git clone: llama-cpp-python's source distribution on PyPI
# vendors a pinned llama.cpp tree, so the build works wherever pip does.
#
#   scripts/build_llamacpp.sh [OUT_DIR]     (default ~/.cache/llama.cpp; several minutes on 2 cores)
#
# Afterwards OUT_DIR/build/bin holds llama-server, llama-bench and llama-quantize, e.g.
#   OUT_DIR/build/bin/llama-server -m model.gguf --host 127.0.0.1 --port 8080 -t 2 -np 16 -c 16384
set -euo pipefail

out_dir=${1:-$HOME/.cache/llama.cpp}
version=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}  # the llama-cpp-python release whose tree we build
jobs=${JOBS:-2}

mkdir -p "$out_dir/src"
cd "$out_dir/src"
if [ ! -d "llama_cpp_python-$version" ]; then
  pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$version" --dest .
  tar -xzf "llama_cpp_python-$version.tar.gz"
fi
tree="$out_dir/src/llama_cpp_python-$version/vendor/llama.cpp"

for tool in cmake ninja; do
  command -v "$tool" >/dev/null || pip install --quiet "$tool"
done

# GGML_NATIVE: tuned for this CPU (AVX2 / AVX-512 where present), as pytgi's kernels are; no
# network features, tests, examples or web UI.
cmake -S "$tree" -B "$out_dir/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
nice cmake --build "$out_dir/build" --parallel "$jobs" --target llama-server llama-bench llama-quantize
echo "llama.cpp tools in $out_dir/build/bin"
