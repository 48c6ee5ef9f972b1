// Eight sums over a warp at once, for pyqwen's CUDA kernels that reduce a value of each of 8 token rows
// (the RMS norm's sums of squares in the GEMV's quantization; the DeltaNet group kernel's q/k norms and outputs).
#pragma once

#include "common.cuh"

// The warp's sums of v[0..7] in 9 shuffles at the depth of one reduction, where eight warp_reduce_sum take
// 40 (and, each behind a branch of its own, eight depths in turn). Each step halves what a lane carries: it
// keeps one half, adds the same half from the lane 16, 8, then 4 apart and sends it the other; the last
// two steps sum 4 lanes. Lane l returns the sum of v[(l/4) % 8].
static __device__ __forceinline__ float pyqwen_warp_sum8(const float (&v)[8]) {
    const int lane = threadIdx.x % WARP_SIZE;
    float a[4], b[2];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const bool hi = lane & 16;
        a[i] = (hi ? v[i + 4] : v[i]) + __shfl_xor_sync(0xFFFFFFFF, hi ? v[i] : v[i + 4], 16, WARP_SIZE);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const bool hi = lane & 8;
        b[i] = (hi ? a[i + 2] : a[i]) + __shfl_xor_sync(0xFFFFFFFF, hi ? a[i] : a[i + 2], 8, WARP_SIZE);
    }
    const bool hi = lane & 4;
    float s = (hi ? b[1] : b[0]) + __shfl_xor_sync(0xFFFFFFFF, hi ? b[0] : b[1], 4, WARP_SIZE);
    s += __shfl_xor_sync(0xFFFFFFFF, s, 2, WARP_SIZE);
    s += __shfl_xor_sync(0xFFFFFFFF, s, 1, WARP_SIZE);
    return s;
}
