// Order-preserving 32-bit key of a float, for pyqwen's CUDA kernels that pick the largest value (the
// sampler's radix select, the GEMV's fused ARGMAX): larger value, larger key. NaN gets 0, below -inf,
// so it is never chosen over a number (ggml's CPU ARGMAX skips it too); -0 becomes +0, so that the two
// tie, as in float comparisons.
#pragma once

#include <cstdint>

static __device__ __forceinline__ uint32_t pyqwen_float_key(const float x) {
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return 0;
    }
    if ((u & 0x7fffffffu) == 0) {
        u = 0;
    }
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
