// The token timeline of gemv_bench (built with -DGEMV_TIMELINE, run with GEMV_TOKEN_TIMELINE=1): thread 0 of every
// GEMV CTA stamps the global timer when it starts, when the kernel before it has finished (past
// ggml_cuda_pdl_sync), when its warp's main loop ends and when it exits. A slot per tile, found from the tile's
// address in the token's one weight arena (every tile spans more than a slot of 1 << GEMV_TL_SLOT_SHIFT bytes),
// so no atomics and no change to the kernel's arguments. Included before gemv-il.cuh, whose GEMV_IL_MARK hooks
// it fills.
#pragma once

#include <cstdint>

#define GEMV_TL_SLOT_SHIFT 12 // 4 KiB: a Q4_0 tile of k = 4096 is 36 KiB

struct gemv_tl_slot { unsigned long long t[4]; };

// null: no stamps (the timed runs); in constant memory: a cached read, not an L2 trip before the first loads
__constant__ gemv_tl_slot * gemv_tl_slots = nullptr;
__constant__ const uint8_t * gemv_tl_base = nullptr;

static __device__ __forceinline__ unsigned long long gemv_tl_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

static __device__ __forceinline__ void gemv_tl_mark(const uint8_t * tile, const int event) {
    gemv_tl_slot * slots = gemv_tl_slots;
    if (threadIdx.x == 0 && slots != nullptr) {
        slots[(tile - gemv_tl_base) >> GEMV_TL_SLOT_SHIFT].t[event] = gemv_tl_now();
    }
}

#define GEMV_IL_MARK(tile, event) gemv_tl_mark(tile, event)

// The smallest step of the global timer seen by one thread reading it back to back (its resolution here).
static __global__ void gemv_tl_resolution(unsigned long long * out) {
    unsigned long long prev = gemv_tl_now(), best = ~0ull;
    for (int i = 0; i < 100000; ++i) {
        const unsigned long long t = gemv_tl_now();
        if (t != prev && t - prev < best) {
            best = t - prev;
        }
        prev = t;
    }
    *out = best;
}
