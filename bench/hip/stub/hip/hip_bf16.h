// Compile-check stub of ROCm 6's hip_bf16.h for ROCm 5.2: the bfloat16 names ggml-cuda uses.
#pragma once
#include <hip/hip_runtime.h>
struct __hip_bfloat16 {
    unsigned short x;
    __host__ __device__ __hip_bfloat16() = default;
    __host__ __device__ __hip_bfloat16(float f) { union { float f; unsigned u; } c{f}; x = (unsigned short) (c.u >> 16); }
    __host__ __device__ operator float() const { union { unsigned u; float f; } c{(unsigned) x << 16}; return c.f; }
};
struct __hip_bfloat162 { __hip_bfloat16 x, y; };
static __host__ __device__ inline float __bfloat162float(__hip_bfloat16 b) { return (float) b; }
static __host__ __device__ inline __hip_bfloat16 __float2bfloat16(float f) { return __hip_bfloat16(f); }
static __host__ __device__ inline float2 __bfloat1622float2(__hip_bfloat162 b) { return make_float2((float) b.x, (float) b.y); }
static __host__ __device__ inline __hip_bfloat162 __float22bfloat162_rn(float2 f) { return { __hip_bfloat16(f.x), __hip_bfloat16(f.y) }; }
