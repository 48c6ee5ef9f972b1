// gemv-il-ggml.cu: the CUDA_IL buffer type and the MUL_MAT entry of the interleaved skinny GEMV
// (bench/gemv/README.md, "The ggml path").
//
// The buffer is plain cudaMalloc memory. Eligible tensors (Q4_0, Q8_0, Q4_K, Q6_K, PQ_W4A8; 2-D, contiguous,
// K a multiple of 256; NVIDIA Ampere or newer) are permuted on the host as they are uploaded and
// un-permuted as they are downloaded, tile batch by tile batch through a small host staging
// buffer, so no extra device memory is used and every reader through the backend API sees ggml's
// bytes. Other tensors behave as in the plain CUDA buffer. cpy_tensor refuses, so no device copy
// ever moves interleaved bytes raw.
#include "gemv-il-ggml.cuh"
#include "gemv-il.cuh"
#include "ggml-backend-impl.h"
#include "ggml-cuda.h"
#include "pyqwen-graph.cuh"
#include "pyqwen-w4a8.h"

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <atomic>
#include <mutex>
#include <vector>

static constexpr size_t GEMV_IL_STAGING_BYTES = 4u << 20; // host staging per transfer batch

struct gemv_il_buffer_context {
    int    device;
    void * dev_ptr;
};

// The CUDA buffer's padding rule: upstream's quantized kernels read a quantized matrix's last row (of ne0
// values) on to a multiple of MATRIX_ROW_PADDING columns, which must be zeros.
static size_t gemv_il_row_padding(const ggml_type type, const int64_t ne0) {
    return ggml_is_quantized(type) && ne0 % MATRIX_ROW_PADDING != 0 ? ggml_row_size(type, MATRIX_ROW_PADDING - ne0 % MATRIX_ROW_PADDING) : 0;
}

static int gemv_il_type(const ggml_type type) {
    switch (type) {
        case GGML_TYPE_Q4_0: return GEMV_IL_Q4_0;
        case GGML_TYPE_Q8_0: return GEMV_IL_Q8_0;
        case GGML_TYPE_Q4_K: return GEMV_IL_Q4_K;
        case GGML_TYPE_Q6_K: return GEMV_IL_Q6_K;
        case GGML_TYPE_PQ_W4A8: return GEMV_IL_W4A8;
        default:             return -1;
    }
}

// The one rule for which tensors of a CUDA_IL buffer are stored interleaved.
static bool gemv_il_eligible(const ggml_tensor * t, const int device) {
#if defined(GGML_USE_HIP)
    GGML_UNUSED(t); GGML_UNUSED(device);
    return false; // the layout is NVIDIA's mma fragment map (bench/gemv/README.md, "HIP")
#elif defined(GGML_CUDA_FORCE_CUBLAS)
    GGML_UNUSED(t); GGML_UNUSED(device);
    return false; // the prefill slabs' strided outputs need mmq (cuBLAS wants contiguous ones)
#else
    return gemv_il_type(t->type) >= 0 && t->ne[2] == 1 && t->ne[3] == 1 && ggml_is_contiguous(t) &&
           t->ne[1] <= INT_MAX && t->ne[0] <= INT_MAX && gemv_il_supported_shape(t->ne[1], t->ne[0]) &&
           ggml_cuda_info().devices[device].cc >= GGML_CUDA_CC_AMPERE; // the .L2::256B loads; Q4_K's u8 and tf32 mmas
#endif // defined(GGML_USE_HIP)
}

bool ggml_cuda_gemv_il_owns(const ggml_tensor * src0) {
    // a view, and so a weight in ggml's layout for a prefill (ggml_cuda_mul_mat_gemv_il), is not
    if (src0->buffer == nullptr || !ggml_backend_buft_is_cuda_gemv_il(src0->buffer->buft) || src0->view_src != nullptr) {
        return false;
    }
    return gemv_il_eligible(src0, ((gemv_il_buffer_context *) src0->buffer->context)->device);
}

bool ggml_backend_cuda_gemv_il_stores(const int device, const ggml_tensor * tensor) {
    return device >= 0 && device < ggml_backend_cuda_get_device_count() && gemv_il_eligible(tensor, device);
}

// ---- W4A8's level tables ----

// On each device: a table of GEMV_IL_W4A8_CODEBOOKS pointers by codebook id, every entry first pointing at
// the uniform codebook's levels, and a copy (4 KiB) of each codebook an upload carries. Made on first use
// and kept for the process, like the codebooks themselves (pyqwen-w4a8.c): captured graphs point into them.
struct gemv_il_w4a8_tables {
    const int8_t ** table = nullptr;  // device
    std::vector<bool> loaded;         // host: which ids have their own levels in the table
};
static std::mutex gemv_il_w4a8_mutex;
static gemv_il_w4a8_tables gemv_il_w4a8[GGML_CUDA_MAX_DEVICES];

static const int8_t * gemv_il_w4a8_upload(const uint32_t id) {
    void * p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, 256*16));
    CUDA_CHECK(cudaMemcpy(p, ggml_pyqwen_w4a8_levels(id), 256*16, cudaMemcpyHostToDevice));
    return (const int8_t *) p;
}

// The device's table; with `ids` (n of them), after making every registered codebook among them its own entry.
static const int8_t * const * gemv_il_w4a8_luts(const int device, const uint32_t * ids = nullptr, const size_t n = 0) {
    std::lock_guard<std::mutex> lock(gemv_il_w4a8_mutex);
    gemv_il_w4a8_tables & t = gemv_il_w4a8[device];
    if (t.table == nullptr) {
        const std::vector<const int8_t *> uniform(GEMV_IL_W4A8_CODEBOOKS, gemv_il_w4a8_upload(0));
        CUDA_CHECK(cudaMalloc(&t.table, uniform.size()*sizeof(uniform[0])));
        CUDA_CHECK(cudaMemcpy(t.table, uniform.data(), uniform.size()*sizeof(uniform[0]), cudaMemcpyHostToDevice));
        t.loaded.assign(GEMV_IL_W4A8_CODEBOOKS, false);
        t.loaded[0] = true;
    }
    for (size_t i = 0; i < n; ++i) {
        const uint32_t id = ids[i];
        if (id < GEMV_IL_W4A8_CODEBOOKS && !t.loaded[id] && ggml_pyqwen_w4a8_levels(id) != nullptr) {
            const int8_t * levels = gemv_il_w4a8_upload(id);
            CUDA_CHECK(cudaMemcpy(t.table + id, &levels, sizeof(levels), cudaMemcpyHostToDevice));
            t.loaded[id] = true;
        }
    }
    return t.table;
}

// The codebook ids of the whole W4A8 blocks among bytes [offset, offset + size) of a tensor, given at `data`.
static std::vector<uint32_t> gemv_il_w4a8_ids(const uint8_t * data, const size_t offset, const size_t size) {
    const size_t bs = sizeof(block_pq_w4a8);
    std::vector<uint32_t> ids;
    for (size_t b = (offset + bs - 1)/bs*bs; b + bs <= offset + size; b += bs) {
        uint32_t id;
        memcpy(&id, data + (b - offset) + offsetof(block_pq_w4a8, cb), sizeof(id));
        if (ids.empty() || ids.back() != id) {
            ids.push_back(id);
        }
    }
    return ids;
}

// ---- MUL_MAT ----

using gemv_il_kernel_t = void (*)(const uint8_t *, const int8_t * const *, const uint8_t *, const float *, float *, int, int, int, int64_t, gemv_il_epilogue);

static gemv_il_kernel_t gemv_il_kernel(const int type) {
    return gemv_il_dispatch(type, [](auto t) -> gemv_il_kernel_t { constexpr int T = decltype(t)::value; return gemv_il_mul_mat<T, gemv_il_stages(T)>; });
}

// CTAs per SM of the GEMV at each warp count: a property of the kernel and the device, asked of the
// CUDA runtime once per process (threads that race here store the same value).
static int gemv_il_ctas_per_sm(const int device, const int type, const int nwarps) {
    static std::atomic<int> cache[GGML_CUDA_MAX_DEVICES][GEMV_IL_NTYPES][GEMV_IL_MAX_WARPS + 1]; // 0: not asked yet
    std::atomic<int> & cached = cache[device][type][nwarps];
    int c = cached.load(std::memory_order_relaxed);
    if (c == 0) {
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&c, gemv_il_kernel(type), nwarps*WARP_SIZE, 0));
        cached.store(c, std::memory_order_relaxed);
    }
    return c;
}

static int gemv_il_nwarps(const int device, const int type, const int64_t n, const int64_t k) {
    const int nsm = ggml_cuda_info().devices[device].nsm;
    return gemv_il_pick_nwarps(n, k, gemv_il_stages(type), nsm, [device, type](int nw) { return gemv_il_ctas_per_sm(device, type, nw); });
}

// dst = W x prologue(x) (+ res) for m token rows of x (row stride stride_x floats), 8 rows per launch pair.
// With `argmax` (I32, m elements) dst is not written: argmax gets the row of each token's largest product.
// With `sums` (m <= 8) the GEMV also leaves its outputs' sums of squares there (gemv_il_epilogue::sums).
static void gemv_il_launch(ggml_backend_cuda_context & ctx, const ggml_tensor * src0, const float * x, const int64_t stride_x,
                           const int64_t m, const gemv_il_prologue prologue, gemv_il_prologue_args p, ggml_tensor * dst,
                           const ggml_tensor * res = nullptr, ggml_tensor * argmax = nullptr, float * sums = nullptr) {
    const int type = gemv_il_type(src0->type);
    const int64_t k = src0->ne[0], n = src0->ne[1];
    const int nwarps = gemv_il_nwarps(ctx.device, type, n, k);
    const int grid = gemv_il_grid(type, n, (int64_t) gemv_il_ctas_per_sm(ctx.device, type, nwarps)*ggml_cuda_info().devices[ctx.device].nsm);
    const int8_t * const * luts = type == GEMV_IL_W4A8 ? gemv_il_w4a8_luts(ctx.device) : nullptr;
    ggml_cuda_pool_alloc<uint8_t> xq(ctx.pool(), gemv_il_xq_bytes(k));
    ggml_cuda_pool_alloc<float>   xs(ctx.pool(), 2*gemv_il_xs_count(k));
    const int64_t stride_dst = dst->nb[1]/sizeof(float);
    ggml_cuda_pool_alloc<unsigned long long> keys(ctx.pool());
    if (argmax) {
        CUDA_CHECK(cudaMemsetAsync(keys.alloc(m), 0, m*sizeof(unsigned long long), ctx.stream()));
    }
    gemv_il_epilogue ep;
    ep.stride_res = res ? res->nb[1]/sizeof(float) : 0;
    GGML_ASSERT(!sums || m <= GEMV_IL_MAX_TOKENS);
    ep.sums = sums;
    const float * z = p.z;
    for (int64_t m0 = 0; m0 < m; m0 += GEMV_IL_MAX_TOKENS) {
        const int mm = (int) std::min<int64_t>(GEMV_IL_MAX_TOKENS, m - m0);
        p.z = z ? z + m0*p.stride_z : nullptr;
        ep.res    = res ? (const float *) res->data + m0*ep.stride_res : nullptr;
        ep.argmax = argmax ? keys.get() + m0 : nullptr;
        ggml_cuda_kernel_launch(gemv_il_quantize_kernel(prologue),
            ggml_cuda_kernel_launch_params(dim3(k/32), dim3(GEMV_IL_MAX_TOKENS*WARP_SIZE), 0, ctx.stream()),
            x + m0*stride_x, stride_x, mm, xq.get(), xs.get(), p);
        ggml_cuda_kernel_launch(gemv_il_kernel(type),
            ggml_cuda_kernel_launch_params(dim3(grid), dim3(nwarps*WARP_SIZE), 0, ctx.stream()),
            (const uint8_t *) src0->data, luts, (const uint8_t *) xq.get(), (const float *) xs.get(),
            (float *) dst->data + m0*stride_dst, (int) n, (int) k, mm, stride_dst, ep);
    }
    if (argmax) {
        ggml_cuda_kernel_launch(gemv_il_argmax_rows, ggml_cuda_kernel_launch_params(dim3(1), dim3(WARP_SIZE), 0, ctx.stream()),
            (const unsigned long long *) keys.get(), (int32_t *) argmax->data, (int) m);
    }
}

// Token groups of 8 up to this many; a larger batch (prefill) has upstream's kernels multiply the weight
// in ggml's layout: moved there in place and back (gemv_il_relayout_tiles: two reads and two writes of
// the weight more than upstream, no memory) where a tile fits in a CTA's shared memory; else, and for
// W4A8, which upstream cannot multiply, slab by slab, each de-interleaved (or expanded to Q8_0) into one
// pool buffer of at most gemv_il_slab_bytes() (the stacked FFN weights of the 9B shape are 54 MiB in Q4_0).
static constexpr int GEMV_IL_MAX_GROUPS = 3;

// 16 MiB unless PYQWEN_GEMV_SLAB_MIB says otherwise: larger slabs trade device memory for prefill speed.
static size_t gemv_il_slab_bytes() {
    static const size_t bytes = [] {
        const char * env = getenv("PYQWEN_GEMV_SLAB_MIB");
        const long mib = env ? strtol(env, nullptr, 10) : 0;
        return (size_t) (mib > 0 ? mib : 16) << 20;
    }();
    return bytes;
}

// Rows [row0, row0 + rows) of src0 in ggml's layout at `plain` (full tiles from tile row0/16 on,
// de-interleaved; the partial last tile's rows, stored as ggml's already, copied), then zeros up to
// the row padding upstream's kernels read past the last row.
static void gemv_il_plain_rows(const ggml_tensor * src0, const int64_t row0, const int64_t rows, uint8_t * plain, cudaStream_t stream) {
    const int type = gemv_il_type(src0->type);
    const int64_t k = src0->ne[0], n = src0->ne[1];
    const size_t row_bytes = ggml_row_size(src0->type, k);
    const int64_t full = std::min(rows, n / GEMV_IL_TILE_ROWS * GEMV_IL_TILE_ROWS - row0); // rows in full tiles
    const uint8_t * src = (const uint8_t *) src0->data + row0*row_bytes;
    if (full > 0) {
        gemv_il_deinterleave_cuda(type, src, plain, k, full / GEMV_IL_TILE_ROWS, stream);
    }
    const int64_t done = std::max<int64_t>(full, 0);
    if (rows > done) {
        CUDA_CHECK(cudaMemcpyAsync(plain + done*row_bytes, src + done*row_bytes, (rows - done)*row_bytes, cudaMemcpyDeviceToDevice, stream));
    }
    const size_t padding = gemv_il_row_padding(src0->type, k);
    if (padding > 0) {
        CUDA_CHECK(cudaMemsetAsync(plain + rows*row_bytes, 0, padding, stream));
    }
}

// The same rows of a W4A8 src0 expanded to Q8_0 at q8 (upstream's kernels have none for W4A8), then the
// Q8_0 row padding.
static void gemv_il_q8_0_rows(const int device, const ggml_tensor * src0, const int64_t row0, const int64_t rows, uint8_t * q8,
                              cudaStream_t stream) {
    const int64_t k = src0->ne[0];
    const int G = gemv_il_deinterleave_chunks(GEMV_IL_W4A8);
    const dim3 grid((unsigned) ((rows + GEMV_IL_TILE_ROWS - 1)/GEMV_IL_TILE_ROWS), (unsigned) ((k/GEMV_IL_CHUNK_K + G - 1)/G));
    gemv_il_w4a8_to_q8_0<<<grid, 256, 0, stream>>>((const uint8_t *) src0->data + row0*ggml_row_size(src0->type, k), q8,
        gemv_il_w4a8_luts(device), k, rows);
    CUDA_CHECK(cudaGetLastError());
    const size_t padding = gemv_il_row_padding(GGML_TYPE_Q8_0, k);
    if (padding > 0) {
        CUDA_CHECK(cudaMemsetAsync(q8 + rows*ggml_row_size(GGML_TYPE_Q8_0, k), 0, padding, stream));
    }
}

void ggml_cuda_mul_mat_gemv_il(ggml_backend_cuda_context & ctx, const ggml_tensor * src0, const ggml_tensor * src1, ggml_tensor * dst,
                               const ggml_cuda_mul_mat_fn upstream) {
    GGML_ASSERT(src1->type == GGML_TYPE_F32 && dst->type == GGML_TYPE_F32);
    GGML_ASSERT(src1->ne[0] == src0->ne[0] && src1->nb[0] == sizeof(float) && dst->nb[0] == sizeof(float));
    GGML_ASSERT(src1->ne[2] == 1 && src1->ne[3] == 1); // the weight is 2-D, so no broadcast

    const int64_t k = src0->ne[0], n = src0->ne[1], m = src1->ne[1];
    if ((m + GEMV_IL_MAX_TOKENS - 1)/GEMV_IL_MAX_TOKENS <= GEMV_IL_MAX_GROUPS) {
        gemv_il_launch(ctx, src0, (const float *) src1->data, src1->nb[1]/sizeof(float), m, GEMV_IL_PLAIN, {}, dst);
        return;
    }

    // the weight as a view: upstream's path, not this one (ggml_cuda_gemv_il_owns). Moved in place, it is in
    // ggml's layout only between two launches on this stream, where every product by it runs.
    ggml_tensor w = *src0;
    w.view_src = const_cast<ggml_tensor *>(src0);
    const int type = gemv_il_type(src0->type);
    if (src0->type != GGML_TYPE_PQ_W4A8 && gemv_il_relayout_smem(type, k) <= ggml_cuda_info().devices[ctx.device].smpbo) {
        uint8_t * data = (uint8_t *) src0->data;
        gemv_il_relayout_tiles_cuda(type, data, k, n / GEMV_IL_TILE_ROWS, /*to_plain =*/ true, ctx.stream());
        upstream(ctx, &w, src1, dst);
        gemv_il_relayout_tiles_cuda(type, data, k, n / GEMV_IL_TILE_ROWS, /*to_plain =*/ false, ctx.stream());
        return;
    }

    const ggml_type slab_type = src0->type == GGML_TYPE_PQ_W4A8 ? GGML_TYPE_Q8_0 : src0->type;
    const size_t row_bytes = ggml_row_size(slab_type, k);
    // whole tiles, and a multiple of the 128 rows of mmq's tile so that only the last slab may need its fallback
    const int64_t slab_rows = std::max<int64_t>(1, (int64_t) (gemv_il_slab_bytes() / (128*row_bytes))) * 128;
    const int64_t max_rows = std::min(slab_rows, n);
    ggml_cuda_pool_alloc<uint8_t> plain(ctx.pool(), max_rows*row_bytes + gemv_il_row_padding(slab_type, k));
    for (int64_t row0 = 0; row0 < n; row0 += slab_rows) {
        const int64_t rows = std::min(slab_rows, n - row0);
        if (slab_type != src0->type) {
            gemv_il_q8_0_rows(ctx.device, src0, row0, rows, plain.get(), ctx.stream());
        } else {
            gemv_il_plain_rows(src0, row0, rows, plain.get(), ctx.stream());
        }
        w.type  = slab_type;
        w.data  = plain.get();
        w.ne[1] = rows;
        w.nb[0] = ggml_type_size(slab_type);
        w.nb[1] = row_bytes;
        w.nb[2] = w.nb[3] = rows*row_bytes;
        ggml_tensor d = *dst;  // the slab's rows of every token row: a strided view
        d.data  = (char *) dst->data + row0*sizeof(float);
        d.ne[0] = rows;
        upstream(ctx, &w, src1, &d);
    }
}

static bool gemv_il_used_once(const ggml_cgraph * cgraph, const int j) {
    return ggml_node_get_use_count(cgraph, j) == 1 && !(cgraph->nodes[j]->flags & GGML_TENSOR_FLAG_OUTPUT);
}

// A product the fused path takes: by an interleaved weight, into f32 rows, over m <= 24 token rows.
static bool gemv_il_takes(const ggml_tensor * mm, const int64_t m) {
    return mm->op == GGML_OP_MUL_MAT && ggml_cuda_gemv_il_owns(mm->src[0]) && mm->type == GGML_TYPE_F32 &&
           mm->nb[0] == sizeof(float) && m <= GEMV_IL_MAX_TOKENS*GEMV_IL_MAX_GROUPS;
}

// A row-vector norm weight of n floats that no node computes: the quantization loads it before it waits for
// the previous kernel.
static bool gemv_il_is_norm_weight(const ggml_tensor * w, const int64_t n) {
    return w->op == GGML_OP_NONE && w->type == GGML_TYPE_F32 && ggml_is_contiguous(w) && w->ne[0] == n && ggml_nrows(w) == 1;
}

// The product mm takes the prologue's input x: f32 rows of x_cols.
static bool gemv_il_fits(const ggml_tensor * mm, const ggml_tensor * x, const int64_t x_cols) {
    return gemv_il_takes(mm, mm->src[1]->ne[1]) &&
           x->type == GGML_TYPE_F32 && x->nb[0] == sizeof(float) && x->ne[0] == x_cols && x->ne[2] == 1 && x->ne[3] == 1;
}

// An input norm at node i, RMS_NORM -> MUL (row vector) -> MUL_MAT by an interleaved weight, which the
// activation quantization computes (GEMV_IL_RMS_NORM): fills the norm's part of p.
static bool gemv_il_input_norm(const ggml_cgraph * cgraph, const int i, gemv_il_prologue_args & p) {
    const ggml_tensor * node = cgraph->nodes[i];
    if (node->op != GGML_OP_RMS_NORM || !ggml_can_fuse_subgraph(cgraph, i, { GGML_OP_RMS_NORM, GGML_OP_MUL, GGML_OP_MUL_MAT }, { i + 2 })) {
        return false;
    }
    const ggml_tensor * mul = cgraph->nodes[i + 1], * mm = cgraph->nodes[i + 2], * x = node->src[0];
    const ggml_tensor * w = mul->src[0] == node ? mul->src[1] : mul->src[0];
    if (mm->src[1] != mul || !gemv_il_fits(mm, x, mm->src[0]->ne[0]) || !ggml_are_same_shape(mul, node) || !gemv_il_is_norm_weight(w, x->ne[0])) {
        return false;
    }
    p.w = (const float *) w->data;
    memcpy(&p.eps, node->op_params, sizeof(float));
    return true;
}

// A residual GEMV whose output an input norm reads next also leaves that output's sums of squares by
// tile of 16 rows, and the norm's quantization sums 256 of those a row (of 4096) where each of its CTAs
// would read the whole rows again: at 8 rows that re-reading cost more than the rest of the quantization
// (bench/RESULTS.md, the 1- and 8-row census). The sums live in the pool from the one node to the next,
// one set at a time per thread (a graph is computed in order on one thread), and are read on the stream
// that wrote them (GGML_CUDA_GRAPH_OPT may run branches of a graph on streams of their own).
struct gemv_il_pending_sums {
    const ggml_tensor * x      = nullptr; // the residual ADD whose rows they sum
    cudaStream_t        stream = nullptr;
    ggml_cuda_pool    * pool   = nullptr;
    float             * sums   = nullptr; // sums[tok*ntiles + tile]
    size_t              size   = 0;
    int                 ntiles = 0;

    void release() {
        if (sums) {
            pool->free(sums, size);
        }
        *this = {};
    }
};
static thread_local gemv_il_pending_sums gemv_il_sums;

// Epilogue fusions, when the product's only reader is the next node: an ADD of a residual of its shape
// (the residual stream after a block's output projection), which the GEMV adds as it writes the ADD's
// result; or an ARGMAX over its rows (greedy decoding over the logits), which it computes in place of
// writing them. Either way the product is never written.

// The residual ADD's index (res = the residual), or -1.
static int gemv_il_residual_add(const ggml_cgraph * cgraph, const int i_mm, const ggml_tensor ** res) {
    const int i_add = pyqwen_next_op(cgraph, i_mm + 1);
    if (i_add >= cgraph->n_nodes || !gemv_il_used_once(cgraph, i_mm)) {
        return -1;
    }
    const ggml_tensor * mm = cgraph->nodes[i_mm], * add = cgraph->nodes[i_add];
    if (add->op != GGML_OP_ADD || (add->src[0] == mm) == (add->src[1] == mm)) {
        return -1;
    }
    const ggml_tensor * r = add->src[0] == mm ? add->src[1] : add->src[0];
    if (r->type != GGML_TYPE_F32 || add->type != GGML_TYPE_F32 || r->nb[0] != sizeof(float) || add->nb[0] != sizeof(float) ||
        !ggml_are_same_shape(r, mm) || !ggml_are_same_shape(add, mm) || mm->ne[2] != 1 || mm->ne[3] != 1) {
        return -1;
    }
    *res = r;
    return i_add;
}

// The ARGMAX's index, or -1.
static int gemv_il_argmax(const ggml_cgraph * cgraph, const int i_mm) {
    const int i_am = pyqwen_next_op(cgraph, i_mm + 1);
    if (i_am >= cgraph->n_nodes || !gemv_il_used_once(cgraph, i_mm)) {
        return -1;
    }
    const ggml_tensor * mm = cgraph->nodes[i_mm], * am = cgraph->nodes[i_am];
    return am->op == GGML_OP_ARGMAX && am->src[0] == mm && am->type == GGML_TYPE_I32 && ggml_is_contiguous(am) &&
           mm->ne[2] == 1 && mm->ne[3] == 1 ? i_am : -1;
}

// The GEMV for the product at i_mm, with the epilogue fusion after it when there is one; returns the
// last node it computed.
static int gemv_il_launch_fused(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, const int i_mm, const float * x,
                                const int64_t stride_x, const int64_t m, const gemv_il_prologue prologue, const gemv_il_prologue_args & p) {
    ggml_tensor * mm = cgraph->nodes[i_mm];
    const ggml_tensor * res = nullptr;
    const int i_add = gemv_il_residual_add(cgraph, i_mm, &res);
    if (i_add >= 0) {
        ggml_tensor * add = cgraph->nodes[i_add];
        const int i_norm = pyqwen_next_op(cgraph, i_add + 1);
        gemv_il_prologue_args next;
        float * sums = nullptr;
        if (m <= GEMV_IL_MAX_TOKENS && i_norm < cgraph->n_nodes && cgraph->nodes[i_norm]->src[0] == add &&
            gemv_il_input_norm(cgraph, i_norm, next)) {
            gemv_il_sums.release();
            const int ntiles = (int) ((add->ne[0] + GEMV_IL_TILE_ROWS - 1)/GEMV_IL_TILE_ROWS);
            size_t size = 0;
            sums = (float *) ctx.pool().alloc(m*ntiles*sizeof(float), &size);
            gemv_il_sums = { add, ctx.stream(), &ctx.pool(), sums, size, ntiles };
        }
        gemv_il_launch(ctx, mm->src[0], x, stride_x, m, prologue, p, add, res, nullptr, sums);
        return i_add;
    }
    const int i_am = gemv_il_argmax(cgraph, i_mm);
    gemv_il_launch(ctx, mm->src[0], x, stride_x, m, prologue, p, mm, nullptr, i_am >= 0 ? cgraph->nodes[i_am] : nullptr);
    return i_am >= 0 ? i_am : i_mm;
}

// The attention output gate at node i: [CONT of a view ->] SIGMOID -> MUL (x, the sigmoid) -> MUL_MAT,
// as the gated attention builds it (pq-graph.c: the gate rows sit between the query rows of each head, and
// the CONT gathers them): the quantization reads the gate where the projection left it, so neither the
// CONT's copy nor the gated product is written. Returns the nodes computed after node i, or 0.
static int gemv_il_sigmoid_gate(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, const int i) {
    const ggml_tensor * node = cgraph->nodes[i];
    const bool with_cont = node->op == GGML_OP_CONT;
    const int i_sig = with_cont ? pyqwen_next_op(cgraph, i + 1) : i;
    if (i_sig >= cgraph->n_nodes || (with_cont && !gemv_il_used_once(cgraph, i))) {
        return 0;
    }
    const ggml_tensor * sig = cgraph->nodes[i_sig];
    if (sig->op != GGML_OP_UNARY || ggml_get_unary_op(sig) != GGML_UNARY_OP_SIGMOID || (with_cont && sig->src[0] != node) ||
        !gemv_il_used_once(cgraph, i_sig)) {
        return 0;
    }
    const int i_mul = pyqwen_next_op(cgraph, i_sig + 1), i_mm = pyqwen_next_op(cgraph, i_mul + 1);
    if (i_mm >= cgraph->n_nodes || !gemv_il_used_once(cgraph, i_mul)) {
        return 0;
    }
    const ggml_tensor * mul = cgraph->nodes[i_mul], * mm = cgraph->nodes[i_mm];
    if (mul->op != GGML_OP_MUL || (mul->src[0] == sig) == (mul->src[1] == sig) || mm->src[1] != mul) {
        return 0;
    }
    const ggml_tensor * x = mul->src[0] == sig ? mul->src[1] : mul->src[0];
    // the gate: [head, heads, m] with strided heads and rows (the CONT's source), or sig's own rows
    const ggml_tensor * g = with_cont ? node->src[0] : sig->src[0];
    const int64_t k = mm->src[0]->ne[0], head = with_cont ? g->ne[0] : k;
    const bool gate_ok = g->type == GGML_TYPE_F32 && g->nb[0] == sizeof(float) && g->ne[3] == 1 &&
                         (with_cont ? g->ne[0]*g->ne[1] == k && g->ne[2] == x->ne[1] && ggml_nelements(node) == ggml_nelements(g)
                                    : g->ne[0] == k && g->ne[1] == x->ne[1] && g->ne[2] == 1);
    if (!gate_ok || !ggml_are_same_shape(sig, x) || !ggml_are_same_shape(mul, x) || !gemv_il_fits(mm, x, k)) {
        return 0;
    }
    gemv_il_prologue_args p;
    p.z         = (const float *) g->data;
    p.stride_z  = (with_cont ? g->nb[2] : g->nb[1])/sizeof(float);
    p.stride_zh = with_cont ? g->nb[1]/sizeof(float) : 0;
    p.head      = (int) head;
    return gemv_il_launch_fused(ctx, cgraph, i_mm, (const float *) x->data, x->nb[1]/sizeof(float), x->ne[1], GEMV_IL_SIGMOID_GATE, p) - i;
}

// Prologue fusion. These node sequences, ending in a MUL_MAT by an interleaved weight with decode-sized
// rows, become one quantization that computes the prologue and the GEMV; the intermediates are never
// written:
//   RMS_NORM -> MUL (row vector) -> MUL_MAT                            (the input norms)
//   SWIGLU -> MUL_MAT                                                  (ffn_down)
//   RMS_NORM (per head) -> MUL (head vector), SILU (z) -> MUL -> MUL_MAT (DeltaNet's gated norm, ssm_out)
//   [CONT ->] SIGMOID (gate) -> MUL -> MUL_MAT                         (the attention output gate, wo)
// Views and reshapes between them are no-ops on the GPU and are skipped with them. Each may end in an
// epilogue fusion (residual ADD, ARGMAX), as may a plain MUL_MAT. Returns the nodes computed after node i.
int ggml_cuda_gemv_il_try_fuse(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, const int i) {
    const ggml_tensor * node = cgraph->nodes[i];
    gemv_il_prologue_args p;
    if (gemv_il_input_norm(cgraph, i, p)) {
        const ggml_tensor * x = node->src[0];
        gemv_il_pending_sums mine;
        if (gemv_il_sums.x == x && gemv_il_sums.stream == ctx.stream()) {
            std::swap(mine, gemv_il_sums);
            p.sums   = mine.sums;
            p.ntiles = mine.ntiles;
        }
        const int done = gemv_il_launch_fused(ctx, cgraph, i + 2, (const float *) x->data, x->nb[1]/sizeof(float), x->ne[1], GEMV_IL_RMS_NORM, p) - i;
        mine.release();
        return done;
    }
    if (!pyqwen_node_is_noop(node)) { // sums nobody claimed (the norm was not the next node after all)
        gemv_il_sums.release();
    }
    if (node->op == GGML_OP_RMS_NORM && i + 1 < cgraph->n_nodes && cgraph->nodes[i + 1]->op == GGML_OP_MUL) {
        // the gated norm: x [head, n_heads, m] per head, times w [head], times silu(z) of x's shape
        const int i_silu = pyqwen_next_op(cgraph, i + 2), i_mm = pyqwen_next_op(cgraph, i_silu + 2);
        if (i_mm < cgraph->n_nodes && i_silu + 1 < cgraph->n_nodes) {
            const ggml_tensor * mul = cgraph->nodes[i + 1], * silu = cgraph->nodes[i_silu], * gated = cgraph->nodes[i_silu + 1];
            const ggml_tensor * mm = cgraph->nodes[i_mm], * x = node->src[0];
            const ggml_tensor * w = mul->src[0] == node ? mul->src[1] : mul->src[0];
            const ggml_tensor * z = silu->src[0];
            // gated reaches the product only through views used once (so nothing else reads its unwritten data)
            bool only_mm = gemv_il_used_once(cgraph, i_silu + 1);
            const ggml_tensor * in = gated;
            for (int j = i_silu + 2; j < i_mm && only_mm; ++j) {
                if (cgraph->nodes[j]->src[0] == in) {
                    in = cgraph->nodes[j];
                    only_mm = gemv_il_used_once(cgraph, j);
                }
            }
            if ((mul->src[0] == node || mul->src[1] == node) && ggml_are_same_shape(mul, x) &&
                silu->op == GGML_OP_UNARY && ggml_get_unary_op(silu) == GGML_UNARY_OP_SILU && gated->op == GGML_OP_MUL &&
                ((gated->src[0] == mul && gated->src[1] == silu) || (gated->src[0] == silu && gated->src[1] == mul)) &&
                only_mm && mm->src[1] == in && ggml_is_contiguous(in) && gemv_il_takes(mm, x->ne[2]) &&
                gemv_il_used_once(cgraph, i) && gemv_il_used_once(cgraph, i + 1) && gemv_il_used_once(cgraph, i_silu) &&
                x->type == GGML_TYPE_F32 && z->type == GGML_TYPE_F32 && ggml_are_same_shape(x, z) && ggml_are_same_shape(x, gated) &&
                x->ne[3] == 1 && x->nb[0] == sizeof(float) && x->nb[1] == x->ne[0]*sizeof(float) &&
                z->nb[0] == sizeof(float) && z->nb[1] == z->ne[0]*sizeof(float) &&
                x->ne[0]*x->ne[1] == mm->src[0]->ne[0] &&
                gemv_il_is_norm_weight(w, x->ne[0])) {
                gemv_il_prologue_args p;
                p.w = (const float *) w->data;
                memcpy(&p.eps, node->op_params, sizeof(float));
                p.z = (const float *) z->data;
                p.stride_z = z->nb[2]/sizeof(float);
                p.head = (int) x->ne[0];
                return gemv_il_launch_fused(ctx, cgraph, i_mm, (const float *) x->data, x->nb[2]/sizeof(float), x->ne[2], GEMV_IL_GATED_NORM, p) - i;
            }
        }
    }
    if (node->op == GGML_OP_GLU && ggml_get_glu_op(node) == GGML_GLU_OP_SWIGLU && node->src[1] == nullptr &&
        ggml_get_op_params_i32(node, 1) == 0 && ggml_can_fuse_subgraph(cgraph, i, { GGML_OP_GLU, GGML_OP_MUL_MAT }, { i + 1 })) {
        const ggml_tensor * mm = cgraph->nodes[i + 1], * x = node->src[0];
        if (mm->src[1] == node && gemv_il_fits(mm, x, 2*mm->src[0]->ne[0])) {
            return gemv_il_launch_fused(ctx, cgraph, i + 1, (const float *) x->data, x->nb[1]/sizeof(float), x->ne[1], GEMV_IL_SWIGLU, {}) - i;
        }
    }
    if (node->op == GGML_OP_CONT || node->op == GGML_OP_UNARY) {
        if (const int done = gemv_il_sigmoid_gate(ctx, cgraph, i)) {
            return done;
        }
    }
    const ggml_tensor * res = nullptr;
    if (node->op == GGML_OP_MUL_MAT && gemv_il_fits(node, node->src[1], node->src[0]->ne[0]) &&
        (gemv_il_residual_add(cgraph, i, &res) >= 0 || gemv_il_argmax(cgraph, i) >= 0)) {
        const ggml_tensor * x = node->src[1];
        return gemv_il_launch_fused(ctx, cgraph, i, (const float *) x->data, x->nb[1]/sizeof(float), x->ne[1], GEMV_IL_PLAIN, {}) - i;
    }
    return 0;
}

// ---- the buffer ----

static void gemv_il_buffer_free_buffer(ggml_backend_buffer_t buffer) {
    gemv_il_buffer_context * ctx = (gemv_il_buffer_context *) buffer->context;
    ggml_cuda_set_device(ctx->device);
    CUDA_CHECK(cudaFree(ctx->dev_ptr));
    delete ctx;
}

static void * gemv_il_buffer_get_base(ggml_backend_buffer_t buffer) {
    return ((gemv_il_buffer_context *) buffer->context)->dev_ptr;
}

// As the CUDA buffer: zero the row padding that upstream's quantized kernels read. A W4A8 weight makes its
// device's level tables now, not inside a graph capture.
static ggml_status gemv_il_buffer_init_tensor(ggml_backend_buffer_t buffer, ggml_tensor * tensor) {
    const int device = ((gemv_il_buffer_context *) buffer->context)->device;
    const size_t padding = gemv_il_row_padding(tensor->type, tensor->ne[0]);
    if (tensor->view_src == nullptr && padding > 0) {
        ggml_cuda_set_device(device);
        CUDA_CHECK(cudaMemset((char *) tensor->data + ggml_nbytes(tensor), 0, padding));
    }
    if (tensor->view_src == nullptr && tensor->type == GGML_TYPE_PQ_W4A8 && gemv_il_eligible(tensor, device)) {
        ggml_cuda_set_device(device);
        gemv_il_w4a8_luts(device);
    }
    return GGML_STATUS_SUCCESS;
}

// A constant stays constant under the permutation.
static void gemv_il_buffer_memset_tensor(ggml_backend_buffer_t buffer, ggml_tensor * tensor, uint8_t value, size_t offset, size_t size) {
    ggml_cuda_set_device(((gemv_il_buffer_context *) buffer->context)->device);
    CUDA_CHECK(cudaMemset((char *) tensor->data + offset, value, size));
}

// Bytes [offset, offset + size) of an eligible tensor, in ggml's layout, moved between `host` and the
// device. Full tiles go through the staging buffer in batches; a batch the range covers only in part
// is first downloaded (set) so that its other bytes survive. The partial last tile is raw.
static void gemv_il_transfer(const ggml_tensor * t, uint8_t * host, const size_t offset, const size_t size, const bool upload) {
    const int type = gemv_il_type(t->type);
    const int64_t k = t->ne[0];
    const size_t tile_bytes = gemv_il_tile_bytes(type, k);
    const size_t il_bytes   = (size_t) (t->ne[1]/GEMV_IL_TILE_ROWS)*tile_bytes; // the interleaved full tiles
    const size_t batch      = std::max<size_t>(1, GEMV_IL_STAGING_BYTES/tile_bytes)*tile_bytes;
    uint8_t * dev = (uint8_t *) t->data;
    std::vector<uint8_t> il(std::min(batch, il_bytes)), plain(il.size());

    const size_t end = offset + size;
    // the batches that [offset, end) meets inside the interleaved tiles (none when it starts past them)
    for (size_t b0 = offset/batch*batch; offset < il_bytes && b0 < std::min(end, il_bytes); b0 += batch) {
        const size_t b1 = std::min(b0 + batch, il_bytes);
        const size_t lo = std::max(offset, b0), hi = std::min(end, b1);
        const bool whole = lo == b0 && hi == b1;
        if (!upload || !whole) {
            CUDA_CHECK(cudaMemcpy(il.data(), dev + b0, b1 - b0, cudaMemcpyDeviceToHost));
            for (size_t p = 0; p < b1 - b0; p += tile_bytes) {
                gemv_il_relayout_tile(type, k, il.data() + p, plain.data() + p, /*inverse =*/ true);
            }
        }
        if (upload) {
            memcpy(plain.data() + (lo - b0), host + (lo - offset), hi - lo);
            for (size_t p = 0; p < b1 - b0; p += tile_bytes) {
                gemv_il_relayout_tile(type, k, plain.data() + p, il.data() + p, /*inverse =*/ false);
            }
            CUDA_CHECK(cudaMemcpy(dev + b0, il.data(), b1 - b0, cudaMemcpyHostToDevice));
        } else {
            memcpy(host + (lo - offset), plain.data() + (lo - b0), hi - lo);
        }
    }
    if (end > il_bytes) { // ggml rows of the partial last tile
        const size_t lo = std::max(offset, il_bytes);
        CUDA_CHECK(upload ? cudaMemcpy(dev + lo, host + (lo - offset), end - lo, cudaMemcpyHostToDevice)
                          : cudaMemcpy(host + (lo - offset), dev + lo, end - lo, cudaMemcpyDeviceToHost));
    }
}

static void gemv_il_buffer_set_tensor(ggml_backend_buffer_t buffer, ggml_tensor * tensor, const void * data, size_t offset, size_t size) {
    const int device = ((gemv_il_buffer_context *) buffer->context)->device;
    ggml_cuda_set_device(device);
    if (tensor->view_src == nullptr && gemv_il_eligible(tensor, device)) {
        if (tensor->type == GGML_TYPE_PQ_W4A8) { // the GEMV looks the codebooks up on the device
            const std::vector<uint32_t> ids = gemv_il_w4a8_ids((const uint8_t *) data, offset, size);
            gemv_il_w4a8_luts(device, ids.data(), ids.size());
        }
        gemv_il_transfer(tensor, (uint8_t *) data, offset, size, /*upload =*/ true);
    } else {
        CUDA_CHECK(cudaMemcpy((char *) tensor->data + offset, data, size, cudaMemcpyHostToDevice));
    }
}

static void gemv_il_buffer_get_tensor(ggml_backend_buffer_t buffer, const ggml_tensor * tensor, void * data, size_t offset, size_t size) {
    const int device = ((gemv_il_buffer_context *) buffer->context)->device;
    ggml_cuda_set_device(device);
    if (tensor->view_src == nullptr && gemv_il_eligible(tensor, device)) {
        gemv_il_transfer(tensor, (uint8_t *) data, offset, size, /*upload =*/ false);
    } else {
        CUDA_CHECK(cudaMemcpy(data, (const char *) tensor->data + offset, size, cudaMemcpyDeviceToHost));
    }
}

// Copies go through get/set, which (un)permute.
static bool gemv_il_buffer_cpy_tensor(ggml_backend_buffer_t, const ggml_tensor *, ggml_tensor *) {
    return false;
}

static void gemv_il_buffer_clear(ggml_backend_buffer_t buffer, uint8_t value) {
    gemv_il_buffer_context * ctx = (gemv_il_buffer_context *) buffer->context;
    ggml_cuda_set_device(ctx->device);
    CUDA_CHECK(cudaMemset(ctx->dev_ptr, value, buffer->size));
}

static const ggml_backend_buffer_i gemv_il_buffer_interface = {
    /* .free_buffer     = */ gemv_il_buffer_free_buffer,
    /* .get_base        = */ gemv_il_buffer_get_base,
    /* .init_tensor     = */ gemv_il_buffer_init_tensor,
    /* .memset_tensor   = */ gemv_il_buffer_memset_tensor,
    /* .set_tensor      = */ gemv_il_buffer_set_tensor,
    /* .get_tensor      = */ gemv_il_buffer_get_tensor,
    /* .set_tensor_2d   = */ NULL,
    /* .get_tensor_2d   = */ NULL,
    /* .cpy_tensor      = */ gemv_il_buffer_cpy_tensor,
    /* .clear           = */ gemv_il_buffer_clear,
    /* .reset           = */ NULL,
};

// ---- the buffer type ----

static const char * gemv_il_buft_get_name(ggml_backend_buffer_type_t) {
    return "CUDA_IL";
}

static ggml_backend_buffer_t gemv_il_buft_alloc_buffer(ggml_backend_buffer_type_t buft, size_t size) {
    const int device = (int) (intptr_t) buft->context;
    ggml_cuda_set_device(device);
    void * dev_ptr = nullptr;
    const cudaError_t err = cudaMalloc(&dev_ptr, std::max<size_t>(size, 1));
    if (err != cudaSuccess) {
        (void) cudaGetLastError();
        GGML_LOG_ERROR("%s: allocating %.2f MiB on device %d: cudaMalloc failed: %s\n", __func__, size/1024.0/1024.0, device, cudaGetErrorString(err));
        return nullptr;
    }
    return ggml_backend_buffer_init(buft, gemv_il_buffer_interface, new gemv_il_buffer_context{device, dev_ptr}, size);
}

static size_t gemv_il_buft_get_alignment(ggml_backend_buffer_type_t) {
    return 128;
}

static size_t gemv_il_buft_get_alloc_size(ggml_backend_buffer_type_t, const ggml_tensor * tensor) {
    return ggml_nbytes(tensor) + gemv_il_row_padding(tensor->type, tensor->ne[0]);
}

static const ggml_backend_buffer_type_i gemv_il_buft_interface = {
    /* .get_name         = */ gemv_il_buft_get_name,
    /* .alloc_buffer     = */ gemv_il_buft_alloc_buffer,
    /* .get_alignment    = */ gemv_il_buft_get_alignment,
    /* .get_max_size     = */ NULL,
    /* .get_alloc_size   = */ gemv_il_buft_get_alloc_size,
    /* .is_host          = */ NULL,
};

bool ggml_backend_buft_is_cuda_gemv_il(ggml_backend_buffer_type_t buft) {
    return buft->iface.get_name == gemv_il_buft_get_name;
}

ggml_backend_buffer_type_t ggml_backend_cuda_gemv_il_buffer_type(int device) {
    static std::mutex mutex;
    std::lock_guard<std::mutex> lock(mutex);
    if (device < 0 || device >= ggml_backend_cuda_get_device_count()) {
        return nullptr;
    }
    static ggml_backend_buffer_type bufts[GGML_CUDA_MAX_DEVICES];
    static bool initialized = false;
    if (!initialized) {
        for (int i = 0; i < ggml_backend_cuda_get_device_count(); i++) {
            bufts[i] = { gemv_il_buft_interface, ggml_backend_reg_dev_get(ggml_backend_cuda_reg(), i), (void *) (intptr_t) i };
        }
        initialized = true;
    }
    return &bufts[device];
}
