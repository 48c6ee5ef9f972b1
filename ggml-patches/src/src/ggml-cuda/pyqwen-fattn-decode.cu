// ggml's FLASH_ATTN_EXT for decode and verify passes through pyqwen_fattn_decode (pyqwen-fattn-kernel.cuh).
#include "pyqwen-fattn-decode.cuh"
#include "pyqwen-fattn-kernel.cuh"

#include <atomic>

// pfa_occupancy, asked of the CUDA runtime once per process and device (threads that race here store the same value).
template <int D, int MT>
static int pfa_ctas_per_sm(const int device) {
    static std::atomic<int> cache[GGML_CUDA_MAX_DEVICES]; // 0: not asked yet
    int c = cache[device].load(std::memory_order_relaxed);
    if (c == 0) {
        c = pfa_occupancy<D, MT>();
        cache[device].store(c, std::memory_order_relaxed);
    }
    return c;
}

// The split (as many CTAs as fit the GPU), the partials' buffer, then both kernels, for `rows` rows a kv head.
template <int D, int MT>
static void pfa_run(ggml_backend_cuda_context & ctx, pfa_args a, const int rows) {
    a.chunk = pfa_chunk(a.n_kv, a.n_head_kv, ggml_cuda_info().devices[ctx.device].nsm, pfa_ctas_per_sm<D, MT>(ctx.device));
    const int nsplit = (a.n_kv + a.chunk - 1)/a.chunk;
    ggml_cuda_pool_alloc<float> partial(ctx.pool(), pfa_partial_floats(D, a.n_head_kv, nsplit, rows));
    a.partial = partial.get();
    // with PDL where ggml-cuda uses it, though 0008 turns it off around this op for upstream's kernels: each of
    // these waits for the kernels before it (ggml_cuda_pdl_sync) before it touches global memory
    const bool pdl_off = ggml_cuda_pdl_off;
    ggml_cuda_pdl_off = false;
    pfa_launch<D, MT>(a, nsplit, rows, ctx.stream());
    ggml_cuda_pdl_off = pdl_off;
    CUDA_CHECK(cudaGetLastError());
}

// One m-tile of 16 rows (decode tokens, short verify passes) or two.
template <int D>
static void pfa_run(ggml_backend_cuda_context & ctx, const pfa_args & a, const int rows) {
    if (pfa_m_tiles(rows) == 1) {
        pfa_run<D, 1>(ctx, a, rows);
    } else {
        pfa_run<D, 2>(ctx, a, rows);
    }
}

bool ggml_cuda_pyqwen_fattn_decode(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * Q = dst->src[0], * K = dst->src[1], * V = dst->src[2], * mask = dst->src[3];
    float scale, max_bias, softcap;
    memcpy(&scale,    (const float *) dst->op_params + 0, sizeof(float));
    memcpy(&max_bias, (const float *) dst->op_params + 1, sizeof(float));
    memcpy(&softcap,  (const float *) dst->op_params + 2, sizeof(float));
    const int64_t D = K->ne[0], n_q = Q->ne[1], n_head = Q->ne[2], n_kv = K->ne[1], n_head_kv = K->ne[2];
    const bool applies =
        dst->src[4] == nullptr && max_bias == 0.0f && softcap == 0.0f && (D == 128 || D == 256) &&
        Q->type == GGML_TYPE_F32 && K->type == GGML_TYPE_F16 && V->type == GGML_TYPE_F16 && dst->type == GGML_TYPE_F32 &&
        Q->ne[0] == D && V->ne[0] == D && V->ne[1] == n_kv && V->ne[2] == n_head_kv && K->nb[1] == V->nb[1] && K->nb[2] == V->nb[2] &&
        Q->ne[3] == 1 && K->ne[3] == 1 && V->ne[3] == 1 && n_q >= 1 && n_head % n_head_kv == 0 &&
        n_head/n_head_kv*n_q <= PFA_MAX_ROWS && n_kv >= 1 &&
        Q->nb[0] == sizeof(float) && K->nb[0] == sizeof(half) && V->nb[0] == sizeof(half) &&
        Q->nb[1] % 16 == 0 && Q->nb[2] % 16 == 0 && (uintptr_t) Q->data % 16 == 0 && // float4 q loads
        K->nb[1] % 16 == 0 && K->nb[2] % 16 == 0 && (uintptr_t) K->data % 16 == 0 && (uintptr_t) V->data % 16 == 0 && // vector K, V loads
        ggml_is_contiguous(dst) &&
        (mask == nullptr || (mask->type == GGML_TYPE_F16 && mask->ne[0] >= n_kv && mask->ne[1] >= n_q &&
                             mask->ne[2] == 1 && mask->ne[3] == 1 && mask->nb[0] == sizeof(half)));
    if (!applies) {
        return false;
    }
    const auto & dev = ggml_cuda_info().devices[ctx.device];
    const int rows = (int) (n_head/n_head_kv*n_q);
    if (!cp_async_available(dev.cc) || pfa_smem((int) D, pfa_m_tiles(rows)) > dev.smpbo) {
        return false; // the kernel needs cp.async and mma (NVIDIA, Ampere on) and up to 92 KB of shared memory (D = 256)
    }
    const pfa_args a = {
        (const float *) Q->data, (int64_t) (Q->nb[1]/sizeof(float)), (int64_t) (Q->nb[2]/sizeof(float)),
        (const half *) K->data, (const half *) V->data, (int64_t) (K->nb[1]/sizeof(half)), (int64_t) (K->nb[2]/sizeof(half)),
        mask ? (const half *) mask->data : nullptr, mask ? (int64_t) (mask->nb[1]/sizeof(half)) : 0,
        (float *) dst->data, (int64_t) (dst->nb[2]/sizeof(float)), (int64_t) (dst->nb[1]/sizeof(float)),
        nullptr, // the partials: pfa_run's
        (int) n_q, (int) n_kv, (int) n_head, (int) n_head_kv, 0, scale, // chunk: pfa_run's
    };
    if (D == 128) {
        pfa_run<128>(ctx, a, rows);
    } else {
        pfa_run<256>(ctx, a, rows);
    }
    return true;
}
