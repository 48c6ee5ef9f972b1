#!/usr/bin/env bash
# Build, check and time the interleaved skinny GEMV on a CUDA GPU in one go (bench/gemv/README.md).
#   bench/gemv/run.sh [--quick]
# Needs nvcc and the extracted ggml tree (vendor/ggml, from vendor/prepare_ggml.py). Upstream's
# mmvq.cu + quantize.cu are compiled beside it for the comparison (about a minute, the slow part of the
# build; GEMV_UPSTREAM=0 skips it); if that fails the harness runs alone.
# Logs and the SASS of the kernels go to $OUT (or the build folder).
set -euo pipefail
cd "$(dirname "$0")/../.."
G=vendor/ggml
B=${GEMV_BUILD:-/tmp/gemv-build}
LOG=${OUT:-$B}
ARCH=${GEMV_ARCH:-90}
mkdir -p "$B" "$LOG"
[ -f $G/src/ggml-cuda/mmvq.cu ] || { echo "run.sh: $G is missing: run python3 vendor/prepare_ggml.py first (or carry vendor/ggml)"; exit 2; }

FLAGS="-std=c++17 -O3 -arch=sm_$ARCH -use_fast_math -extended-lambda -I$G/include -I$G/src -I$G/src/ggml-cuda -Ibench/gemv ${GEMV_NVCC_FLAGS:-}"
t0=$(date +%s)
if [ "${GEMV_UPSTREAM:-1}" = 1 ]; then
    nvcc $FLAGS -c $G/src/ggml-cuda/mmvq.cu     -o $B/mmvq.o     > $B/mmvq.log 2>&1 & up1=$!
    nvcc $FLAGS -c $G/src/ggml-cuda/quantize.cu -o $B/quantize.o > $B/quantize.log 2>&1 & up2=$!
else
    false & up1=$!; up2=$up1
fi
nvcc $FLAGS -Xcompiler -O3,-pthread -Xptxas -v -DGEMV_BENCH_UPSTREAM -c bench/gemv/gemv_bench.cu -o $B/gemv_bench_up.o 2> $LOG/ptxas.txt & ours=$!
nvcc $FLAGS -Xcompiler -O3,-pthread -c bench/gemv/gemv_bench.cu -o $B/gemv_bench.o
c++ -O2 -std=c++17 -pthread -Iggml-patches/src/src/ggml-cuda bench/gemv/gemv_il_cpu_test.cpp -o $B/gemv_il_cpu_test
wait $ours
if wait $up1 && wait $up2; then
    nvcc -arch=sm_$ARCH $B/gemv_bench_up.o $B/mmvq.o $B/quantize.o -o $B/gemv_bench -lpthread
else
    echo "run.sh: upstream mmvq did not build ($B/mmvq.log, $B/quantize.log): timing ours alone"
    nvcc -arch=sm_$ARCH $B/gemv_bench.o -o $B/gemv_bench -lpthread
fi
echo "build: $(( $(date +%s) - t0 )) s"
grep -A2 "gemv_il_mul_mat\|gemv_il_quantize" $LOG/ptxas.txt | grep -o "Used [0-9]* registers\|[0-9]* bytes spill stores" | paste - - | sort | uniq -c || true
if command -v cuobjdump > /dev/null; then
    cuobjdump --dump-sass $B/gemv_bench > $LOG/sass.txt 2>&1 || true
    # instruction mix of each GEMV kernel: activation loads (LDG.E.128), weight loads (LDG.E.NA), int8 mma,
    # LOP3 unpack, shuffles, local memory
    awk '/Function : .*gemv_il_mul_mat/ {name=$3} /Function : / && !/gemv_il_mul_mat/ {name=""}
         name != "" { for (op in want) if (index($0, op)) cnt[name " " op]++ }
         BEGIN { split("LDG.E.128 LDG.E.NA IMMA LOP3 SHFL LDL STL", w, " "); for (i in w) want[w[i]] = 1 }
         END { for (c in cnt) print "sass", c, cnt[c] }' $LOG/sass.txt | sort
fi

$B/gemv_il_cpu_test | tail -1
$B/gemv_bench "$@" 2>&1 | tee $LOG/gemv_bench.log
