#!/usr/bin/env bash
# pyqwen's CUDA ops inside ggml, on a CUDA GPU, through ggml's public API: builds vendor/ggml with CUDA
# (flash attention included: fattn_decode_check goes through it) and the checks, then runs them:
#   bench/gemv/gemv_il_ggml_check.cpp  the interleaved GEMV: CUDA_IL round trip, MUL_MAT against float64
#                                      and upstream's CUDA kernels
#   bench/deltanet_prep_check.cpp      GGML_OP_PYQWEN_DELTANET_PREP for 1..17 tokens against ggml's CPU backend
#   bench/fattn_decode_check.cpp       FLASH_ATTN_EXT for 1..9 rows (pyqwen_fattn_decode, patch 0009) against it
# ggml is a subdirectory of a small wrapper project, as in pyqwen's own build: the sdist's ggml tree
# lacks what a standalone ggml build configures (tests, examples, ggml.pc.in).
# Needs the extracted, patched tree (python3 vendor/prepare_ggml.py, or carry vendor/ggml).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${CUDA_OPS_BUILD:-/tmp/cuda-ops-check}
mkdir -p "$B/wrapper"
cat > "$B/wrapper/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.18)
project(pyqwen_cuda_ops_check C CXX)
add_subdirectory("$ROOT/vendor/ggml" ggml EXCLUDE_FROM_ALL)
foreach(check gemv/gemv_il_ggml_check deltanet_prep_check fattn_decode_check)
    get_filename_component(name \${check} NAME)
    add_executable(\${name} "$ROOT/bench/\${check}.cpp")
    target_link_libraries(\${name} PRIVATE ggml ggml-cpu ggml-cuda)
endforeach()
CMAKE
cmake -S "$B/wrapper" -B "$B" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=${CUDA_OPS_ARCH:-90} \
      -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF > "$B/cmake.log"
cmake --build "$B" -j"$(nproc)" --target gemv_il_ggml_check deltanet_prep_check fattn_decode_check > "$B/build.log" 2>&1 || { tail -40 "$B/build.log"; exit 1; }
rc=0
"$B/gemv_il_ggml_check" || rc=1
"$B/deltanet_prep_check" || rc=1
"$B/fattn_decode_check" || rc=1
exit $rc
