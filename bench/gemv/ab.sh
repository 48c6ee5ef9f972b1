#!/usr/bin/env bash
# A/B of the GEMV kernels of git revisions on a decode token's GEMVs (gemv_bench --token), in one GPU call:
#   bench/gemv/ab.sh build REV...   (here, with nvcc) gemv_bench of each revision, compiled for sm_90 from that
#                                   revision's patched ggml tree -> .devcarry/gemv-ab/gemv_bench_<rev>
#   bench/gemv/ab.sh run [SPEC]...  (on the GPU machine; carry [".devcarry/gemv-ab"]) each binary's --quick
#                                   checks, then --token SPEC with each binary in turn, twice; SPEC is "TYPE SHAPE",
#                                   default "q4_0 9b" "q4_k 9b" "q4_0 27b"
# A CUDA toolkit without cuBLAS headers (ggml's CUDA headers include them) takes them from the nvidia-cublas
# wheel: GEMV_NVCC_FLAGS="-I<its unpacked nvidia/cu13/include>".
# The token runs with the model's prologues and residuals (GEMV_TOKEN_PROLOGUES=1; set it to 0 for plain
# quantizations). A revision's binary carries its own picks and kernels, so the rows compare whole revisions.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
AB=$ROOT/.devcarry/gemv-ab

build() {
    [ $# -gt 0 ] || { echo "ab.sh build: name the revisions to compare"; exit 2; }
    local work=/tmp/gemv-ab flags="-std=c++17 -O3 -arch=sm_90 -use_fast_math -extended-lambda ${GEMV_NVCC_FLAGS:-}"
    mkdir -p "$AB" "$work"
    local sdist
    sdist=$(ls "$ROOT"/vendor/*.tar.gz 2> /dev/null | head -1 || true)
    for rev in "$@"; do
        local sha tree
        sha=$(git -C "$ROOT" rev-parse --short "$rev")
        tree=$work/$sha
        rm -rf "$tree" && mkdir -p "$tree"
        git -C "$ROOT" archive "$sha" | tar -x -C "$tree"
        PYQWEN_GGML_SDIST=${sdist:-} python3 "$tree/vendor/prepare_ggml.py" > /dev/null
        local inc="-I$tree/vendor/ggml/include -I$tree/vendor/ggml/src -I$tree/vendor/ggml/src/ggml-cuda -I$tree/bench -I$tree/bench/gemv"
        if [ ! -f "$work/mmvq.o" ]; then # upstream's mmvq for the harness's comparison rows: the same in every revision
            nvcc $flags $inc -c "$tree/vendor/ggml/src/ggml-cuda/mmvq.cu" -o "$work/mmvq.o"
            nvcc $flags $inc -c "$tree/vendor/ggml/src/ggml-cuda/quantize.cu" -o "$work/quantize.o"
        fi
        nvcc $flags $inc -Xcompiler -O3,-pthread -DGEMV_BENCH_UPSTREAM -c "$tree/bench/gemv/gemv_bench.cu" -o "$work/$sha.o"
        nvcc -arch=sm_90 "$work/$sha.o" "$work/mmvq.o" "$work/quantize.o" -o "$AB/gemv_bench_$sha" -lpthread
        echo "$AB/gemv_bench_$sha ($rev)"
    done
}

run() {
    [ $# -gt 0 ] || set -- "q4_0 9b" "q4_k 9b" "q4_0 27b"
    local bins=("$AB"/gemv_bench_*) log
    log=$(mktemp)
    for b in "${bins[@]}"; do
        chmod +x "$b"
        "$b" --quick > "$log" 2>&1 && rc=0 || rc=$?
        echo "$(basename "$b") --quick: exit $rc, $(tail -n 1 "$log")"
        grep '^FAIL' "$log" | head -5 || true
    done
    export GEMV_TOKEN_PROLOGUES=${GEMV_TOKEN_PROLOGUES:-1}
    echo
    echo "| token (GEMV_TOKEN_PROLOGUES=$GEMV_TOKEN_PROLOGUES) | binary | us at M = 1, two runs | us at M = 8, two runs |"
    echo "|---|---|---|---|"
    for spec in "$@"; do
        declare -A m1=() m8=()
        for _ in 1 2; do
            for b in "${bins[@]}"; do
                # shellcheck disable=SC2086
                "$b" --token $spec > "$log" 2>&1 || echo "$(basename "$b") --token $spec failed: $(tail -n 1 "$log")" >&2
                m1[$b]+="${m1[$b]:+, }$(awk -F'|' '/^\| \| 1 \|/ {gsub(/ /, "", $4); printf "%s", $4}' "$log")"
                m8[$b]+="${m8[$b]:+, }$(awk -F'|' '/^\| \| 8 \|/ {gsub(/ /, "", $4); printf "%s", $4}' "$log")"
            done
        done
        for b in "${bins[@]}"; do
            echo "| $spec | $(basename "$b") | ${m1[$b]} | ${m8[$b]} |"
        done
        unset m1 m8
    done
    rm -f "$log"
}

case "${1:-}" in
    build) shift; build "$@" ;;
    run)   shift; run "$@" ;;
    *)     sed -n '2,12p' "$0"; exit 2 ;;
esac
