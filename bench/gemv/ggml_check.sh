#!/usr/bin/env bash
# The GEMV inside ggml on a CUDA GPU: builds vendor/ggml with CUDA (about 3-4 min on 16 cores), then
# gemv_il_ggml_check.cpp (CUDA_IL round trip and MUL_MAT against ggml's CPU backend).
# Needs the extracted, patched tree (python3 vendor/prepare_ggml.py, or carry vendor/ggml).
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${GEMV_GGML_BUILD:-/tmp/gemv-ggml-build}
mkdir -p "$B"
cmake -S vendor/ggml -B "$B" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=${GEMV_ARCH:-90} -DCMAKE_BUILD_TYPE=Release \
      -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=ON > "$B/cmake.log"
cmake --build "$B" -j"$(nproc)" --target ggml > "$B/build.log" 2>&1 || { tail -40 "$B/build.log"; exit 1; }
LINK=()
for d in $(find "$B" -name 'libggml*.so' -printf '%h\n' | sort -u); do LINK+=("-L$d" "-Wl,-rpath,$d"); done
c++ -O2 -std=c++17 -Ivendor/ggml/include bench/gemv/gemv_il_ggml_check.cpp "${LINK[@]}" \
    -lggml -lggml-base -lggml-cpu -lggml-cuda -o "$B/gemv_il_ggml_check"
"$B/gemv_il_ggml_check"
