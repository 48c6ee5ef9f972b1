#!/usr/bin/env bash
# Compile-check for HIP (AMD) of pyqwen's CUDA sources and of ggml-cuda.cu with patches 0005-0007, on a
# machine without ROCm 6 or an AMD GPU:
# Debian 12's hipcc (ROCm 5.2: `apt-get install hipcc libamdhip64-dev`) with bench/hip/stub/ for what
# it lacks and ggml-cuda uses (hipBLAS declarations, hip_bf16.h, half2 shuffles, __hmax and a few HIP
# runtime names). Nothing is linked or run. Targets: gfx1030 (RDNA2) and gfx90a (CDNA2; there ROCm 5.2's clang also rejects
# upstream's bf16 MFMA in mma.cuh, in every file that includes it, ours and upstream's mmf.cu alike).
# Needs the extracted, patched tree (python3 vendor/prepare_ggml.py).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
G=$ROOT/vendor/ggml
export HIP_PLATFORM=amd HIP_COMPILER=clang HIP_RUNTIME=rocclr  # hipcc would pick nvcc where CUDA is installed
rc=0
for f in ${HIP_CHECK_FILES:-pyqwen-deltanet.cu pyqwen-sample.cu pyqwen-embed.cu gemv-il-ggml.cu ggml-cuda.cu}; do
    for arch in ${HIP_CHECK_ARCHS:-gfx1030 gfx90a}; do
        log=$(mktemp)
        if hipcc -std=c++17 -O1 --offload-arch="$arch" -x hip -include "$ROOT/bench/hip/stub/rocm52_compat.h" \
                 -I"$ROOT/bench/hip/stub" -I"$G/include" -I"$G/src" -I"$G/src/ggml-cuda" -DGGML_USE_HIP \
                 -c "$G/src/ggml-cuda/$f" -o /dev/null > "$log" 2>&1; then
            echo "$f $arch: ok"
        elif [ "$arch" = gfx90a ] && ! grep "error:" "$log" | grep -qv "mma.cuh:13[0-9][0-9]"; then
            echo "$f $arch: only upstream's bf16 MFMA errors of ROCm 5.2 (mma.cuh)"
        else
            echo "$f $arch: FAILED"; grep "error" "$log" | head -20; rc=1
        fi
        rm -f "$log"
    done
done
exit $rc
