#!/usr/bin/env bash
# The GEMV inside ggml on a CUDA GPU: builds vendor/ggml with CUDA (without flash attention, which the
# check does not use) and gemv_il_ggml_check.cpp (CUDA_IL round trip and MUL_MAT against ggml's CPU backend),
# then runs the check. ggml is a subdirectory of a small wrapper project, as in pyqwen's own build: the
# sdist's ggml tree lacks what a standalone ggml build configures (tests, examples, ggml.pc.in).
# Needs the extracted, patched tree (python3 vendor/prepare_ggml.py, or carry vendor/ggml).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
B=${GEMV_GGML_BUILD:-/tmp/gemv-ggml-build}
mkdir -p "$B/wrapper"
cat > "$B/wrapper/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.18)
project(gemv_il_ggml_check C CXX)
add_subdirectory("$ROOT/vendor/ggml" ggml EXCLUDE_FROM_ALL)
add_executable(gemv_il_ggml_check "$ROOT/bench/gemv/gemv_il_ggml_check.cpp")
target_link_libraries(gemv_il_ggml_check PRIVATE ggml ggml-cpu ggml-cuda)
CMAKE
cmake -S "$B/wrapper" -B "$B" -DGGML_CUDA=ON -DGGML_CUDA_FA=OFF -DCMAKE_CUDA_ARCHITECTURES=${GEMV_ARCH:-90} \
      -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF > "$B/cmake.log"
cmake --build "$B" -j"$(nproc)" --target gemv_il_ggml_check > "$B/build.log" 2>&1 || { tail -40 "$B/build.log"; exit 1; }
"$B/gemv_il_ggml_check"
