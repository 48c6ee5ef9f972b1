// Compile-check shims for ROCm 5.2 (Debian 12's hipcc) of what ROCm 6 provides and ggml-cuda uses.
#pragma once
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
static __device__ inline __half  __hmax(__half a, __half b) { return __hgt(a, b) ? a : b; }
static __device__ inline __half2 __shfl_xor(__half2 v, int m, int w = warpSize) { int i = *(int *) &v; i = __shfl_xor(i, m, w); return *(__half2 *) &i; }
static __device__ inline __half2 __shfl_up(__half2 v, unsigned d, int w = warpSize) { int i = *(int *) &v; i = __shfl_up(i, d, w); return *(__half2 *) &i; }
#define hipDeviceAttributeVirtualMemoryManagementSupported hipDeviceAttributeMemoryPoolsSupported
#define hipHostRegisterReadOnly 0x08
static inline hipError_t hipStreamWaitEvent(hipStream_t s, hipEvent_t e) { return hipStreamWaitEvent(s, e, 0); }
