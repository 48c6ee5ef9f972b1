// gemv-il.cuh: skinny linear Y[M, N] = X[M, K] W[N, K]^T for M = 1..8 token rows on int8 tensor cores,
// over Q4_0 / Q8_0 / Q4_K / Q6_K / W4A8 weights re-laid out once into gemv-il-layout.h's interleaved tiles.
//
// One mma.m16n8k32 (s8 x s8 -> s32) multiplies a 32-block of 16 weight rows with the same block of
// the 8 token rows, so 8 tokens cost what 1 costs: the work per weight byte does not depend on M.
// Each block's int32 product is scaled by its weight scale and float activation scale in fp32. Q4_K: the
// unsigned codes in a u8 x s8 mma, times the 6-bit scale in int32; the mins times the activation block sums
// are one tf32 mma per chunk (twice: hi and lo parts of the sums), and d, dmin apply per chunk. Q6_K has a scale per 16 values: two mma.m16n8k16 per
// block, their int32 results times the int8 scales added in int32, and the fp16 d applied per chunk. W4A8's
// codes become their int8 levels by a lookup in the codebook's table (its scale per 16 values is inside the
// levels), so one s8 mma per block, and the row's fp32 d applies per chunk.
// A CTA owns a 16-row tile at a time (Q4_0, Q4_K and Q8_0 CTAs loop over several: gemv_il_persistent); its warps
// split K (chunk c goes to warp c % nwarps) and add up their partial sums in shared memory at the end. Weights
// are read once, as 16-byte streaming loads that skip L1; the activations (10*K bytes) are read by every CTA
// and stay in L1/L2. They are read with plain loads, never ld.global.nc: the previous kernel writes them, and
// under PDL only coherent loads after griddepcontrol.wait are guaranteed to see its writes (ggml drops
// __restrict__ for the same reason).
//
// Launch with ggml_cuda_kernel_launch: on Hopper it enables programmatic dependent launch, and the
// GEMV loads its first weight chunks before waiting for the kernel that writes its activations.
//
// CUDA only for now, Ampere and newer (the loads' .L2::256B qualifier, Q4_K's u8 and tf32 mmas): the
// fragment layout is NVIDIA's. An AMD port keeps the kernel structure and swaps the layout for the MFMA / WMMA
// fragments (bench/gemv/README.md, "HIP").
#pragma once

#include "common.cuh"
#include "mma.cuh"
#include "gemv-il-layout.h"
#include "pyqwen-float-key.cuh"
#include "pyqwen-warp-sum.cuh"

#include <type_traits>

// A CTA's times for bench/gemv/gemv_bench.cu's token timeline (gemv_timeline.cuh defines it there); nothing here.
#ifndef GEMV_IL_MARK
#define GEMV_IL_MARK(tile, event)
#endif

#define GEMV_IL_MAX_WARPS 16 // K split per CTA

// Weights are streamed once: keep them out of L1 and ask L2 for whole 256-byte sectors groups.
static __device__ __forceinline__ uint4 gemv_il_load_stream16(const uint8_t * p) {
    uint4 v;
#if defined(GGML_USE_HIP)
    v = *(const uint4 *) p;
#else
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
#endif // defined(GGML_USE_HIP)
    return v;
}

static __device__ __forceinline__ uint2 gemv_il_load_stream8(const uint8_t * p) {
    uint2 v;
#if defined(GGML_USE_HIP)
    v = *(const uint2 *) p;
#else
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
#endif // defined(GGML_USE_HIP)
    return v;
}

static __device__ __forceinline__ uint32_t gemv_il_load_stream4(const uint8_t * p) {
    uint32_t v;
#if defined(GGML_USE_HIP)
    v = *(const uint32_t *) p;
#else
    asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
#endif // defined(GGML_USE_HIP)
    return v;
}

// One chunk (16 rows x 256 K) of a warp's lane: the words of its quant loads and its meta words
// (4 fp16 scales, the Q4_K headers of rows g and g+8, Q6_K's 8 int8 scales and {d[g], d[g+8]}, or W4A8's
// 8 scale bytes and fp32 {d[g], d[g+8]}).
template <int type>
struct gemv_il_chunk {
    uint32_t q[gemv_il_loads(type)][4];
    uint32_t s[gemv_il_meta_words(type)];
};

template <int type>
static __device__ __forceinline__ void gemv_il_load_chunk(gemv_il_chunk<type> & r, const uint8_t * chunk, const int lane) {
#pragma unroll
    for (int j = 0; j < gemv_il_loads(type); ++j) {
        const uint4 v = gemv_il_load_stream16(chunk + j*GEMV_IL_WARP_LOAD + lane*16);
        r.q[j][0] = v.x; r.q[j][1] = v.y; r.q[j][2] = v.z; r.q[j][3] = v.w;
    }
    const uint8_t * meta = chunk + gemv_il_quant_bytes(type);
    if constexpr (type == GEMV_IL_Q4_K) { // two headers; the 4 lanes of a group load the same ones
#pragma unroll
        for (int i = 0; i < 8; i += 4) {
            const uint4 h = gemv_il_load_stream16(meta + 2*gemv_il_meta_word_unit(type, lane, i));
            r.s[i] = h.x; r.s[i + 1] = h.y; r.s[i + 2] = h.z; r.s[i + 3] = h.w;
        }
        return;
    }
    const uint2 s = gemv_il_load_stream8(meta + 2*gemv_il_meta_word_unit(type, lane, 0));
    r.s[0] = s.x; r.s[1] = s.y;
    // the 4 lanes of a group load the same words: one 32-byte (W4A8: 64-byte) sector
    if constexpr (type == GEMV_IL_W4A8) {
        const uint2 d = gemv_il_load_stream8(meta + 2*gemv_il_meta_word_unit(type, lane, 2));
        r.s[2] = d.x; r.s[3] = d.y;
    } else if constexpr (gemv_il_meta_words(type) > 2) {
        r.s[2] = gemv_il_load_stream4(meta + 2*gemv_il_meta_word_unit(type, lane, 2));
    }
}

// The same registers gathered from ggml's row layout: the rows of the last, partial tile (nrows < 16);
// missing rows read as zero. Blocks are 2-byte aligned, hence the 16-bit loads; a W4A8 word is two units.
static __device__ __forceinline__ uint32_t gemv_il_gather_bytes(const uint8_t * rows, const int nrows, const int row,
                                                                const int64_t off, const int nbytes) {
    if (row >= nrows) {
        return 0;
    }
    const uint16_t * p = (const uint16_t *) (rows + off);
    return nbytes == 4 ? (uint32_t) p[0] | ((uint32_t) p[1] << 16) : (uint32_t) p[0];
}

template <int type>
static __device__ void gemv_il_gather_chunk(gemv_il_chunk<type> & r, const uint8_t * rows, const int nrows, const int64_t k,
                                            const int c, const int lane) {
#pragma unroll
    for (int j = 0; j < gemv_il_loads(type); ++j) {
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            constexpr int ub = gemv_il_quant_unit_bytes(type);
            uint32_t v = 0;
#pragma unroll
            for (int u = 0; u < 4/ub; ++u) {
                const int qi = (j*(GEMV_IL_WARP_LOAD/4) + lane*4 + w)*(4/ub) + u;
                v |= gemv_il_gather_bytes(rows, nrows, gemv_il_quant_src(type, qi).row, gemv_il_quant_src_offset(type, k, c, qi), ub) << 8*ub*u;
            }
            r.q[j][w] = v;
        }
    }
#pragma unroll
    for (int i = 0; i < gemv_il_meta_words(type); ++i) {
        const int si0 = gemv_il_meta_word_unit(type, lane, i);
        const uint32_t lo = gemv_il_gather_bytes(rows, nrows, gemv_il_meta_src(type, si0).row,     gemv_il_meta_src_offset(type, k, c, si0),     2);
        const uint32_t hi = gemv_il_gather_bytes(rows, nrows, gemv_il_meta_src(type, si0 + 1).row, gemv_il_meta_src_offset(type, k, c, si0 + 1), 2);
        r.s[i] = lo | (hi << 16);
    }
}

static __device__ __forceinline__ float2 gemv_il_half2_bits_to_float2(const uint32_t bits) {
    half2 h;
    memcpy(&h, &bits, sizeof(h));
    return __half22float2(h);
}

// mma.m16n8k32 with u8 A (Q4_K's codes: q and 16*q) and s8 B, C = 0 (Ampere and newer; ggml's mma wrapper
// has s8 A only).
static __device__ __forceinline__ void gemv_il_mma_u8s8(int d[4], const uint32_t a[4], const int b0, const int b1) {
#if __CUDA_ARCH__ >= GGML_CUDA_CC_AMPERE
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %10, %10, %10};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));
#else
    GGML_UNUSED_VARS(d, a, b0, b1);
    NO_DEVICE_CODE;
#endif // __CUDA_ARCH__ >= GGML_CUDA_CC_AMPERE
}

// acc (rows g, g+8 x tokens 2t, 2t+1, the mma's C layout) += the 8 blocks of 32 of chunk c (its weights in r).
// xq, xs: the activation codes, then scales and block sums (Q4_K only) of all k; levels: W4A8's level tables of
// rows g and g+8.
template <int type>
static __device__ __forceinline__ void gemv_il_chunk_dot(const gemv_il_chunk<type> & r, const int c, const uint8_t * xq_all,
                                                         const float * xs_all, const int k, const int8_t * const * levels,
                                                         const int lane, float acc[4]) {
#if defined(GGML_USE_HIP)
    // NVIDIA's mma fragment layouts; on HIP the weights are never interleaved (gemv_il_eligible)
    GGML_UNUSED_VARS(r, c, xq_all, xs_all, k, levels, lane, acc);
    NO_DEVICE_CODE;
#else
    const int64_t cs = (int64_t) c*(GEMV_IL_CHUNK_BLOCKS*GEMV_IL_MAX_TOKENS);
    const uint8_t * xq   = xq_all + (int64_t) c*(GEMV_IL_CHUNK_K*GEMV_IL_MAX_TOKENS);
    const float   * xs   = xs_all + cs;
    const float   * xsum = xs_all + gemv_il_xs_count(k) + cs;
    using namespace ggml_cuda_mma;
    [[maybe_unused]] float accd[4] = {0.0f, 0.0f, 0.0f, 0.0f};    // the chunk's sums before its rows' d (Q4_K: even sub-blocks)
    [[maybe_unused]] float accd_hi[4] = {0.0f, 0.0f, 0.0f, 0.0f}; // Q4_K: odd sub-blocks, codes 16*q
    [[maybe_unused]] uint32_t sc[2][2];                           // Q4_K: scales of rows g, g+8 (gemv_il_q4_k_scales)
    [[maybe_unused]] tile<16, 8, float> mins;                     // Q4_K: sum of min * block sum per row and token
    [[maybe_unused]] int nan_rows = 0;                            // W4A8: rows g (bit 0), g+8 (bit 1) with a NaN scale
    if constexpr (type == GEMV_IL_Q4_K) {
        gemv_il_q4_k_scales(r.s, sc[0]);
        gemv_il_q4_k_scales(r.s + 4, sc[1]);
        tile<16, 8, float> A;
        gemv_il_q4_k_mins(r.s, r.s + 4, lane & 3, A.x);
        // B: the block sums of token g for sub-blocks t and t+4, in two tf32 parts
        tile<8, 8, float> Bhi, Blo;
        gemv_il_tf32_split(xsum[gemv_il_xs_index(lane >> 2, lane & 3)],     Bhi.x[0], Blo.x[0]);
        gemv_il_tf32_split(xsum[gemv_il_xs_index(lane >> 2, 4 + (lane & 3))], Bhi.x[1], Blo.x[1]);
        mma(mins, A, Bhi);
        mma(mins, A, Blo);
    }
#pragma unroll
    for (int jp = 0; jp < GEMV_IL_CHUNK_BLOCKS/2; ++jp) {
        const uint4  xa = *(const uint4  *) (xq + jp*GEMV_IL_WARP_LOAD + lane*16);
        const float4 xd = *(const float4 *) (xs + jp*16 + (lane & 3)*4);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            uint32_t b0 = h ? xa.z : xa.x, b1 = h ? xa.w : xa.y;
            if constexpr (type == GEMV_IL_W4A8) { // its k order
                const uint32_t other = __shfl_xor_sync(0xFFFFFFFF, gemv_il_w4a8_swap_out(lane & 3, b0, b1), 2, WARP_SIZE);
                gemv_il_w4a8_swap(lane & 3, other, b0, b1);
            }
            // block 2jp + h: its scales sit in lane 4g + jp
            const int   src = (lane & ~3) | jp;
            const float dx0 = h ? xd.z : xd.x;
            const float dx1 = h ? xd.w : xd.y;
            uint32_t a[4];
            if constexpr (type == GEMV_IL_W4A8) {
                const uint32_t sw = __shfl_sync(0xFFFFFFFF, r.s[h], src, WARP_SIZE);
                gemv_il_w4a8_frag(r.q, 2*jp + h, sw, lane & 3, levels, a);
                nan_rows |= gemv_il_w4a8_nan_rows(sw);
            } else {
                gemv_il_frag_a(type, r.q, 2*jp + h, a);
            }
            if constexpr (type == GEMV_IL_Q6_K) {
                // a scale per 16 values: one k16 MMA per half of the block (a0, a1 with b0; a2, a3 with b1)
                tile<16, 4, int> Alo, Ahi;
                tile<8, 4, int>  Blo, Bhi;
                Alo.x[0] = a[0]; Alo.x[1] = a[1]; Blo.x[0] = b0;
                Ahi.x[0] = a[2]; Ahi.x[1] = a[3]; Bhi.x[0] = b1;
                tile<16, 8, int> Dlo, Dhi;
                mma(Dlo, Alo, Blo);
                mma(Dhi, Ahi, Bhi);
                int c[4];
                gemv_il_q6_k_scale(Dlo.x, Dhi.x, __shfl_sync(0xFFFFFFFF, r.s[h], src, WARP_SIZE), c);
                accd[0] += (float) c[0] * dx0;
                accd[1] += (float) c[1] * dx1;
                accd[2] += (float) c[2] * dx0;
                accd[3] += (float) c[3] * dx1;
                continue;
            }
            if constexpr (type == GEMV_IL_Q4_K) {
                // exact in int32 and in the float: |c * sc| <= 16*15*127*32*63, a multiple of 16 below 2^26
                int c[4];
                gemv_il_mma_u8s8(c, a, b0, b1);
                const int b = 2*jp + h;
                const int sg = gemv_il_byte<false>(sc[0][b >> 2], b & 3), sg8 = gemv_il_byte<false>(sc[1][b >> 2], b & 3);
                float * ad = h ? accd_hi : accd;
                ad[0] += (float) (c[0]*sg)  * dx0;
                ad[1] += (float) (c[1]*sg)  * dx1;
                ad[2] += (float) (c[2]*sg8) * dx0;
                ad[3] += (float) (c[3]*sg8) * dx1;
                continue;
            }
            tile<16, 8, int> A;
            A.x[0] = a[0]; A.x[1] = a[1]; A.x[2] = a[2]; A.x[3] = a[3];
            tile<8, 8, int> B;
            B.x[0] = b0;
            B.x[1] = b1;
            tile<16, 8, int> D;
            mma(D, A, B);
            if constexpr (type == GEMV_IL_W4A8) { // exact: |D| <= 32*127*127
                accd[0] += (float) D.x[0] * dx0;
                accd[1] += (float) D.x[1] * dx1;
                accd[2] += (float) D.x[2] * dx0;
                accd[3] += (float) D.x[3] * dx1;
                continue;
            }
            const float2 dw = gemv_il_half2_bits_to_float2(__shfl_sync(0xFFFFFFFF, r.s[h], src, WARP_SIZE));
            acc[0] += (float) D.x[0] * (dw.x*dx0);
            acc[1] += (float) D.x[1] * (dw.x*dx1);
            acc[2] += (float) D.x[2] * (dw.y*dx0);
            acc[3] += (float) D.x[3] * (dw.y*dx1);
        }
    }
    if constexpr (type == GEMV_IL_Q4_K) {
        const float2 dg = gemv_il_half2_bits_to_float2(r.s[0]), dg8 = gemv_il_half2_bits_to_float2(r.s[4]); // {d, dmin}
        acc[0] += dg.x *(accd[0] + accd_hi[0]*(1.0f/16.0f)) - dg.y *mins.x[0];
        acc[1] += dg.x *(accd[1] + accd_hi[1]*(1.0f/16.0f)) - dg.y *mins.x[1];
        acc[2] += dg8.x*(accd[2] + accd_hi[2]*(1.0f/16.0f)) - dg8.y*mins.x[2];
        acc[3] += dg8.x*(accd[3] + accd_hi[3]*(1.0f/16.0f)) - dg8.y*mins.x[3];
    }
    if constexpr (type == GEMV_IL_W4A8) {
        const float dg = nan_rows & 1 ? NAN : __uint_as_float(r.s[2]), dg8 = nan_rows & 2 ? NAN : __uint_as_float(r.s[3]);
        acc[0] += accd[0]*dg;
        acc[1] += accd[1]*dg;
        acc[2] += accd[2]*dg8;
        acc[3] += accd[3]*dg8;
    }
    if constexpr (type == GEMV_IL_Q6_K) {
        const float2 d = gemv_il_half2_bits_to_float2(r.s[2]); // {d[g], d[g+8]}
        acc[0] += accd[0]*d.x;
        acc[1] += accd[1]*d.x;
        acc[2] += accd[2]*d.y;
        acc[3] += accd[3]*d.y;
    }
#endif // defined(GGML_USE_HIP)
}

// What the GEMV does with its outputs besides storing them (the graph-level fusion is in gemv-il-ggml.cu).
struct gemv_il_epilogue {
    const float        * res        = nullptr; // adds res[tok*stride_res + row] (a residual ADD; may alias dst)
    int64_t              stride_res = 0;
    unsigned long long * argmax     = nullptr; // instead of storing: atomicMax of gemv_il_argmax_key per token
    float              * sums       = nullptr; // also: each token's sum of squares of the tile's stored outputs
                                               // at sums[tok*ntiles + tile], for the RMS norm that reads them next
};

// Orders (value, row) as ggml's ARGMAX picks: the larger value, then the lower row; NaN never wins over
// a number. Keys start at 0.
static __device__ __forceinline__ unsigned long long gemv_il_argmax_key(const float v, const int row) {
    return (unsigned long long) pyqwen_float_key(v) << 32 | (0xFFFFFFFFu - (uint32_t) row);
}

// The row of each token's key.
static __global__ void gemv_il_argmax_rows(const unsigned long long * keys, int32_t * dst, const int m) {
    ggml_cuda_pdl_sync();
    if ((int) threadIdx.x < m) {
        dst[threadIdx.x] = (int32_t) (0xFFFFFFFFu - (uint32_t) keys[threadIdx.x]);
    }
}

// Register stages of gemv_il_mul_mat per type, from a 9B decode token's 129 GEMVs on the H200
// (bench/RESULTS.md, seventh and eighth sessions): a second stage hides the longer chunk math of Q4_K
// (-9%) and W4A8 (-3%) and the longer loads of Q8_0 (-5%); it costs Q4_0 11% and does nothing for Q6_K.
GEMV_IL_HD constexpr int gemv_il_stages(int type) {
    return type == GEMV_IL_Q4_K || type == GEMV_IL_Q8_0 || type == GEMV_IL_W4A8 ? 2 : 1;
}

// W4A8: the level tables of rows g and g+8, by the ids in the tile's first chunk's meta (a partial tile's rows:
// in their first block; missing rows take row 0's). The loader gives every block a registered id; a
// foreign one indexes the table modulo its size, whose unused entries hold the uniform codebook.
template <int type>
static __device__ __forceinline__ void gemv_il_tile_levels(const int8_t * levels[2], const int8_t * const * luts, const uint8_t * tile,
                                                           const int nrows, const int k, const int lane) {
    if constexpr (type == GEMV_IL_W4A8) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int row = lane/4 + 8*i;
            const uint8_t * id = nrows == GEMV_IL_TILE_ROWS ? tile + gemv_il_w4a8_il_offset(row, GEMV_IL_W4A8_CB)
                                                            : tile + (row < nrows ? row : 0)*gemv_il_row_bytes(type, k) + GEMV_IL_W4A8_CB;
            levels[i] = luts[*(const uint32_t *) id & (GEMV_IL_W4A8_CODEBOOKS - 1)];
        }
    }
}

// A CTA's shared memory for its tiles' outputs.
struct gemv_il_tile_smem {
    float              partial[GEMV_IL_MAX_WARPS][WARP_SIZE*4];
    unsigned long long best[GEMV_IL_MAX_TOKENS];                     // the argmax keys of the CTA's tiles
    float              squares[GEMV_IL_TILE_ROWS][GEMV_IL_MAX_TOKENS];
};

// The argmax keys of a CTA's tiles gather in sm.best, zeroed before its first tile's keys (gemv_il_tile_store's
// barrier orders the two), then go to ep.argmax once.
static __device__ __forceinline__ void gemv_il_argmax_init(gemv_il_tile_smem & sm, const gemv_il_epilogue & ep) {
    if (ep.argmax && threadIdx.x < GEMV_IL_MAX_TOKENS) {
        sm.best[threadIdx.x] = 0;
    }
}

static __device__ __forceinline__ void gemv_il_argmax_flush(const gemv_il_tile_smem & sm, const int m, const gemv_il_epilogue & ep) {
    if (ep.argmax) { // uniform over the CTA
        __syncthreads();
        if ((int) threadIdx.x < m) {
            atomicMax(&ep.argmax[threadIdx.x], sm.best[threadIdx.x]);
        }
    }
}

// Tile `tile` of `ntiles` (rows row0.., nrows of them) from its warps' accumulators: stored with the epilogue's
// residual, or its argmax keys kept in sm.best, and its sums of squares. Ends with sm.partial and sm.squares still
// being read.
template <int type>
static __device__ __forceinline__ void gemv_il_tile_store(gemv_il_tile_smem & sm, const float acc[4], const int tile,
                                                          const int ntiles, const int row0, const int nrows, const int m,
                                                          float * dst, const int64_t stride_dst, const gemv_il_epilogue & ep) {
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, nwarps = blockDim.x / WARP_SIZE;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        sm.partial[warp][lane*4 + i] = acc[i];
    }
    __syncthreads();
    // 128 outputs (16 rows x 8 tokens); a CTA of fewer than 4 warps writes several per thread
    for (int e = threadIdx.x; e < WARP_SIZE*4; e += blockDim.x) {
        float sum = 0.0f;
        for (int i = 0; i < nwarps; ++i) {
            sum += sm.partial[i][e];
        }
        // e = 4*lane' + i holds C element i of lane' = 4g + t: row g + 8*(i/2), token 2t + i%2
        const int l = e / 4, i = e % 4;
        const int row = (l / 4) + 8*(i / 2), tok = 2*(l % 4) + i % 2;
        float v = 0.0f;
        if (tok < m && row < nrows) {
            v = sum*gemv_il_out_scale(type) + (ep.res ? ep.res[tok*ep.stride_res + row0 + row] : 0.0f);
            if (ep.argmax) {
                atomicMax(&sm.best[tok], gemv_il_argmax_key(v, row0 + row));
            } else {
                dst[tok*stride_dst + row0 + row] = v;
            }
        }
        if (ep.sums) {
            sm.squares[row][tok] = v*v;
        }
    }
    if (ep.sums) { // uniform over the CTA; the rows in a fixed order, so a replay gives the same bits
        __syncthreads();
        if ((int) threadIdx.x < m) {
            float ss = 0.0f;
            for (int row = 0; row < GEMV_IL_TILE_ROWS; ++row) {
                ss += sm.squares[row][threadIdx.x];
            }
            ep.sums[threadIdx.x*ntiles + tile] = ss;
        }
    }
}

// Whether a type's GEMV runs as tile loops (gemv_il_tile_loops): each warp keeps its next loads in flight through
// the tile's epilogue. On the H200 (gemv_bench --token with the model's prologues, twenty-first session) that took
// the 9B token's GEMVs 3.7% faster in Q4_0 (74 registers, not 64; at S = 2 it was 15% slower), 4.3% in Q4_K, 1.9% in
// Q8_0, the 27B's Q4_0 0.9%. W4A8 keeps a CTA a tile: 128 registers in the loops, not 108, and 7.4% slower (twentieth
// session); Q6_K too, whose GEMV in a decode token is the output projection of many waves (not measured as loops).
GEMV_IL_HD constexpr bool gemv_il_persistent(int type) {
    return type == GEMV_IL_Q4_K || type == GEMV_IL_Q8_0 || type == GEMV_IL_Q4_0;
}

// One CTA a tile. See gemv_il_mul_mat.
template <int type, int S>
static __device__ __forceinline__ void gemv_il_one_tile(const uint8_t * w, const int8_t * const * luts, const uint8_t * xq, const float * xs,
                                                        float * dst, const int n, const int k, const int m, const int64_t stride_dst,
                                                        const gemv_il_epilogue & ep) {
    const int lane    = threadIdx.x % WARP_SIZE;
    const int warp    = threadIdx.x / WARP_SIZE;
    const int nwarps  = blockDim.x / WARP_SIZE;
    const int nchunks = k / GEMV_IL_CHUNK_K;
    const int row0    = blockIdx.x*GEMV_IL_TILE_ROWS;
    const int nrows   = min(n - row0, GEMV_IL_TILE_ROWS);
    // full tiles and the partial last tile's ggml rows both start here
    const uint8_t * tile = w + (int64_t) blockIdx.x*gemv_il_tile_bytes(type, k);
    GEMV_IL_MARK(tile, 0);

    const auto load = [&](gemv_il_chunk<type> & r, const int c) {
        if (c >= nchunks) {
            return;
        }
        if (nrows == GEMV_IL_TILE_ROWS) {
            gemv_il_load_chunk<type>(r, tile + (int64_t) c*gemv_il_chunk_bytes(type), lane);
        } else {
            gemv_il_gather_chunk<type>(r, tile, nrows, k, c, lane);
        }
    };

    const int8_t * levels[2] = {nullptr, nullptr};
    gemv_il_tile_levels<type>(levels, luts, tile, nrows, k, lane);

    // The weights do not depend on the previous kernel: their first loads overlap its tail.
    gemv_il_chunk<type> r[S];
#pragma unroll
    for (int s = 0; s < S; ++s) {
        load(r[s], warp + s*nwarps);
    }
    ggml_cuda_pdl_sync();
    GEMV_IL_MARK(tile, 1);

    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int c0 = warp; c0 < nchunks; c0 += S*nwarps) {
#pragma unroll
        for (int s = 0; s < S; ++s) {
            const int c = c0 + s*nwarps;
            if (c < nchunks) {
                gemv_il_chunk_dot<type>(r[s], c, xq, xs, k, levels, lane, acc);
            }
            load(r[s], c + S*nwarps);
        }
    }
    GEMV_IL_MARK(tile, 2);
    ggml_cuda_pdl_lc();

    __shared__ gemv_il_tile_smem sm;
    gemv_il_argmax_init(sm, ep);
    gemv_il_tile_store<type>(sm, acc, blockIdx.x, gridDim.x, row0, nrows, m, dst, stride_dst, ep);
    gemv_il_argmax_flush(sm, m, ep);
    GEMV_IL_MARK(tile, 3);
}

// Tiles blockIdx.x, blockIdx.x + gridDim.x, ...: a warp walks its chunks of all of them as one sequence, each
// register stage loading its first chunk of the next full tile as it finishes this one, so those loads are in
// flight while the CTA adds up and stores the tile. The partial last tile (fewer than 16 rows, gathered from
// ggml's rows) takes its chunks one at a time in a loop of its own, which keeps the gather's registers out of
// the pipelined loop's. See gemv_il_mul_mat.
template <int type, int S>
static __device__ __forceinline__ void gemv_il_tile_loops(const uint8_t * w, const int8_t * const * luts, const uint8_t * xq, const float * xs,
                                                          float * dst, const int n, const int k, const int m, const int64_t stride_dst,
                                                          const gemv_il_epilogue & ep) {
    const int lane    = threadIdx.x % WARP_SIZE;
    const int warp    = threadIdx.x / WARP_SIZE;
    const int nwarps  = blockDim.x / WARP_SIZE;
    const int nchunks = k / GEMV_IL_CHUNK_K;
    const int ntiles  = (n + GEMV_IL_TILE_ROWS - 1) / GEMV_IL_TILE_ROWS;
    const int nfull   = n / GEMV_IL_TILE_ROWS;
    // full tiles and the partial last tile's ggml rows both start here
    const auto tile_at = [&](const int t) { return w + (int64_t) t*gemv_il_tile_bytes(type, k); };
    const auto load = [&](gemv_il_chunk<type> & r, const int t, const int c) {
        gemv_il_load_chunk<type>(r, tile_at(t) + (int64_t) c*gemv_il_chunk_bytes(type), lane);
    };

    // The weights do not depend on the previous kernel: their first loads overlap its tail.
    GEMV_IL_MARK(tile_at(blockIdx.x), 0);
    gemv_il_chunk<type> r[S];
    if ((int) blockIdx.x < nfull) {
#pragma unroll
        for (int s = 0; s < S; ++s) {
            if (warp + s*nwarps < nchunks) {
                load(r[s], blockIdx.x, warp + s*nwarps);
            }
        }
    }
    ggml_cuda_pdl_sync();

    __shared__ gemv_il_tile_smem sm;
    gemv_il_argmax_init(sm, ep);
    for (int t = blockIdx.x; t < ntiles; t += gridDim.x) {
        const uint8_t * tile = tile_at(t);
        const int row0 = t*GEMV_IL_TILE_ROWS, nrows = min(n - row0, GEMV_IL_TILE_ROWS), next = t + gridDim.x;
        if (t != (int) blockIdx.x) {
            GEMV_IL_MARK(tile, 0);
        }
        GEMV_IL_MARK(tile, 1);
        const int8_t * levels[2] = {nullptr, nullptr};
        gemv_il_tile_levels<type>(levels, luts, tile, nrows, k, lane);

        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (t < nfull) {
            for (int c0 = warp; c0 < nchunks; c0 += S*nwarps) {
#pragma unroll
                for (int s = 0; s < S; ++s) {
                    const int c = c0 + s*nwarps;
                    if (c < nchunks) {
                        gemv_il_chunk_dot<type>(r[s], c, xq, xs, k, levels, lane, acc);
                        if (c + S*nwarps < nchunks) {
                            load(r[s], t, c + S*nwarps);
                        } else if (next < nfull) { // this stage's first chunk of the next tile
                            load(r[s], next, warp + s*nwarps);
                        }
                    }
                }
            }
        } else {
            for (int c = warp; c < nchunks; c += nwarps) {
                gemv_il_gather_chunk<type>(r[0], tile, nrows, k, c, lane);
                gemv_il_chunk_dot<type>(r[0], c, xq, xs, k, levels, lane, acc);
            }
        }
        GEMV_IL_MARK(tile, 2);
        if (next >= ntiles) {
            ggml_cuda_pdl_lc();
        }
        gemv_il_tile_store<type>(sm, acc, t, ntiles, row0, nrows, m, dst, stride_dst, ep);
        GEMV_IL_MARK(tile, 3);
        if (next < ntiles) { // before the next tile writes sm.partial and sm.squares
            __syncthreads();
        }
    }
    gemv_il_argmax_flush(sm, m, ep);
}

// Y = X W^T for m <= 8 token rows: dst[tok*stride_dst + row], with the epilogue's residual added, or only its
// argmax keys. Grid gemv_il_grid, block (32 * nwarps, nwarps <= GEMV_IL_MAX_WARPS); a CTA's warps split each of its
// tiles' chunks (chunk c to warp c % nwarps) and add up their partial sums in shared memory at the end.
// luts: W4A8's level tables by codebook id (else unused). S: register stages per warp. With S = 1 a warp loads
// its next chunk after using the current one; with S = 2 the next load is in flight while it computes (twice
// the registers for the weights). gemv_il_stages picks S per type.
template <int type, int S>
static __global__ void __launch_bounds__(GEMV_IL_MAX_WARPS*WARP_SIZE)
gemv_il_mul_mat(const uint8_t * w, const int8_t * const * luts, const uint8_t * xq, const float * xs, float * dst,
                const int n, const int k, const int m, const int64_t stride_dst, const gemv_il_epilogue ep) {
    if constexpr (gemv_il_persistent(type)) {
        gemv_il_tile_loops<type, S>(w, luts, xq, xs, dst, n, k, m, stride_dst, ep);
    } else {
        gemv_il_one_tile<type, S>(w, luts, xq, xs, dst, n, k, m, stride_dst, ep);
    }
}

// CTAs of a GEMV over n rows: one a tile, or for a type of tile loops as many as are resident at once (slots: CTAs
// per SM times SMs), at most one a tile.
static int gemv_il_grid(const int type, const int64_t n, const int64_t slots) {
    const int64_t ntiles = (n + GEMV_IL_TILE_ROWS - 1) / GEMV_IL_TILE_ROWS;
    return (int) (gemv_il_persistent(type) ? std::max<int64_t>(1, std::min(ntiles, slots)) : ntiles);
}

// What the activation quantization computes from its input rows x before rounding, so that the
// intermediate never reaches memory (the graph-level fusion is in gemv-il-ggml.cu):
enum gemv_il_prologue {
    GEMV_IL_PLAIN,        // x itself
    GEMV_IL_RMS_NORM,     // x / sqrt(mean(x^2) + eps) * w (ggml's RMS_NORM then MUL by a row vector)
    GEMV_IL_SWIGLU,       // silu(x[i]) * x[k + i]: x holds gate | up (ggml's single-input SWIGLU)
    GEMV_IL_GATED_NORM,   // RMS_NORM per run of `head` elements, times w[i % head], times silu(z[i])
    GEMV_IL_SIGMOID_GATE, // x[i] * sigmoid(z[i / head * stride_zh + i % head]) (the attention output gate)
};

// The prologue's other inputs (unused fields stay zero).
struct gemv_il_prologue_args {
    const float * w         = nullptr; // the norm's weight: k floats (RMS_NORM) or `head` (GATED_NORM)
    float         eps       = 0.0f;
    const float * z         = nullptr; // GATED_NORM: the gate, z[tok*stride_z + i]; SIGMOID_GATE: as above
    int64_t       stride_z  = 0;
    int64_t       stride_zh = 0;       // SIGMOID_GATE: floats from one head's gate to the next
    int           head      = 0;       // GATED_NORM: elements per normalized run; SIGMOID_GATE: per head
    const float * sums      = nullptr; // RMS_NORM: x's sums of squares by tile of 16, from the GEMV that wrote x
    int           ntiles    = 0;       //   (gemv_il_epilogue::sums), sums[tok*ntiles + tile]
};

// sum(x[i]^2, i < n) over one warp (every lane gets it); n a multiple of 32. Rows 16-byte aligned with
// n a multiple of 128 take float4 loads.
static __device__ __forceinline__ float gemv_il_warp_sum_squares(const float * x, const int64_t n) {
    const int lane = threadIdx.x % WARP_SIZE;
    float ss = 0.0f;
    if (n % (4*WARP_SIZE) == 0 && (uintptr_t) x % 16 == 0) {
        const float4 * x4 = (const float4 *) x;
#pragma unroll 8
        for (int64_t i = lane; i < n/4; i += WARP_SIZE) {
            const float4 t = x4[i];
            ss += t.x*t.x + t.y*t.y + t.z*t.z + t.w*t.w;
        }
    } else {
#pragma unroll 8
        for (int64_t i = lane; i < n; i += WARP_SIZE) {
            ss += x[i]*x[i];
        }
    }
    return warp_reduce_sum(ss);
}

// ss[t] = the sum of every thread's acc[t] over the CTA's 8 warps, for t < m; then a barrier. The rows' warp
// sums in one step (acc[t] is 0 for t >= m): an 8-row pass's 65 norm quantizations each took eight reductions
// in turn.
static __device__ __forceinline__ void gemv_il_cta_reduce(const float (&acc)[GEMV_IL_MAX_TOKENS], const int m,
                                                          float (*partial)[GEMV_IL_MAX_TOKENS], float * ss) {
    static_assert(GEMV_IL_MAX_TOKENS == 8, "pyqwen_warp_sum8's 8 rows");
    const int w = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const float sum = pyqwen_warp_sum8(acc); // row lane/4's
    if (lane % 4 == 0 && lane/4 < m) {
        partial[lane/4][w] = sum;
    }
    __syncthreads();
    if (threadIdx.x < m) {
        float sum = 0.0f;
        for (int i = 0; i < GEMV_IL_MAX_TOKENS; ++i) {
            sum += partial[threadIdx.x][i];
        }
        ss[threadIdx.x] = sum;
    }
    __syncthreads();
}

// sum(x[t*stride_x + i]^2, i < k) for the m rows t of x, by the CTA's 8 warps: warp w sums the w-th
// eighth of every row, with all of a lane's loads independent (in flight together), then the eighths
// meet in shared memory. One L2 round trip for a decode row where the row's own warp needed four.
// Every thread of the CTA must call it; ss[t] holds row t's sum after it.
static __device__ __forceinline__ void gemv_il_cta_sum_squares(const float * x, const int64_t stride_x, const int m, const int64_t k,
                                                               float (*partial)[GEMV_IL_MAX_TOKENS], float * ss) {
    const int w = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int64_t n = k / GEMV_IL_MAX_TOKENS; // a multiple of 32: k is of whole 256-chunks
    const float * base = x + w*n;
    float acc[GEMV_IL_MAX_TOKENS] = {};
    if (n % (4*WARP_SIZE) == 0 && (uintptr_t) x % 16 == 0 && stride_x % 4 == 0) {
        for (int64_t i = lane; i < n/4; i += WARP_SIZE) {
#pragma unroll
            for (int t = 0; t < GEMV_IL_MAX_TOKENS; ++t) {
                if (t < m) {
                    const float4 v = ((const float4 *) (base + t*stride_x))[i];
                    acc[t] += v.x*v.x + v.y*v.y + v.z*v.z + v.w*v.w;
                }
            }
        }
    } else {
        for (int64_t i = lane; i < n; i += WARP_SIZE) {
#pragma unroll
            for (int t = 0; t < GEMV_IL_MAX_TOKENS; ++t) {
                if (t < m) {
                    acc[t] += base[t*stride_x + i]*base[t*stride_x + i];
                }
            }
        }
    }
    gemv_il_cta_reduce(acc, m, partial, ss);
}

// grid (k/32), block 256 = 8 warps = the 8 token rows (rows >= m are written as zeros). x[tok*stride_x + i];
// xs holds gemv_il_xs_count(k) scales, then as many sums. IEEE divisions on purpose: ggml builds with
// -use_fast_math, and the CPU reference must get the same codes. The norms sum the squares of their
// rows (or heads) again in every CTA, from L1/L2: cheaper than a launch for decode rows, with independent
// loads in flight (a lane summing its 128 floats of a 4096 row one dependent load at a time made the
// RMS_NORM prologue 6 us a launch, 13% of a 9B decode step).
template <int prologue>
static __global__ void __launch_bounds__(GEMV_IL_MAX_TOKENS*WARP_SIZE)
gemv_il_quantize(const float * x, const int64_t stride_x, const int m, uint8_t * xq, float * xs, const gemv_il_prologue_args p) {
    ggml_cuda_pdl_lc();
    const int64_t b   = blockIdx.x;
    const int     tok = threadIdx.x / WARP_SIZE;
    const int     kk  = threadIdx.x % WARP_SIZE;
    const int64_t k   = (int64_t) gridDim.x*32;
    const int64_t e   = b*32 + kk;

    // the norms' weights are constants: loaded while the previous kernel finishes
    [[maybe_unused]] float wn = 0.0f;
    if constexpr (prologue == GEMV_IL_RMS_NORM) {
        wn = p.w[e];
    } else if constexpr (prologue == GEMV_IL_GATED_NORM) {
        wn = p.w[e % p.head];
    }
    ggml_cuda_pdl_sync();
    // this token's inputs (u: SwiGLU's up value or the gate), loaded before the norms' sums so that their L2
    // round trips overlap; one token per warp: the branches and the warp reductions are uniform
    const float * row = x + tok*stride_x;
    float v = 0.0f;
    [[maybe_unused]] float u = 0.0f;
    if (tok < m) {
        v = row[e];
        if constexpr (prologue == GEMV_IL_SWIGLU) {
            u = row[k + e];
        } else if constexpr (prologue == GEMV_IL_GATED_NORM) {
            u = p.z[tok*p.stride_z + e];
        } else if constexpr (prologue == GEMV_IL_SIGMOID_GATE) {
            u = p.z[tok*p.stride_z + e / p.head * p.stride_zh + e % p.head];
        }
    }
    // RMS_NORM: this token's sum of squares, from the tiles' sums by its own warp (no barrier), else
    // summed again by the CTA
    [[maybe_unused]] float ss = 0.0f;
    if constexpr (prologue == GEMV_IL_RMS_NORM) {
        if (p.sums) {
            if (tok < m) {
                for (int i = kk; i < p.ntiles; i += WARP_SIZE) {
                    ss += p.sums[tok*p.ntiles + i];
                }
            }
            ss = warp_reduce_sum(ss);
        } else {
            __shared__ float partial[GEMV_IL_MAX_TOKENS][GEMV_IL_MAX_TOKENS], row_ss[GEMV_IL_MAX_TOKENS];
            gemv_il_cta_sum_squares(x, stride_x, m, k, partial, row_ss);
            ss = row_ss[tok];
        }
    }
    if (tok < m) {
        if constexpr (prologue == GEMV_IL_RMS_NORM) {
            v *= rsqrtf(ss/(float) k + p.eps)*wn;
        } else if constexpr (prologue == GEMV_IL_SWIGLU) {
            v = v/(1.0f + expf(-v))*u;
        } else if constexpr (prologue == GEMV_IL_GATED_NORM) {
            const int64_t h0 = e / p.head * p.head;
            float hs = 0.0f;
            if (p.head % WARP_SIZE == 0) { // the warp's 32 elements lie in one head
                hs = gemv_il_warp_sum_squares(row + h0, p.head);
            } else {
                for (int i = 0; i < p.head; ++i) {
                    hs += row[h0 + i]*row[h0 + i];
                }
            }
            v *= rsqrtf(hs/(float) p.head + p.eps)*wn*(u/(1.0f + expf(-u)));
        } else if constexpr (prologue == GEMV_IL_SIGMOID_GATE) {
            v *= 1.0f/(1.0f + expf(-u));
        }
    }
    const float amax = warp_reduce_max(fabsf(v));
    const float d    = __fdiv_rn(amax, 127.0f);
    const int   q    = amax == 0.0f ? 0 : (int) roundf(__fdiv_rn(v, d));
    const int   qsum = warp_reduce_sum(q);
    xq[gemv_il_xq_offset(tok, b, kk)] = (uint8_t) (int8_t) q;
    if (kk == 0) {
        xs[gemv_il_xs_index(tok, b)] = d;
        xs[GEMV_IL_MAX_TOKENS*gridDim.x + gemv_il_xs_index(tok, b)] = d*(float) qsum;
    }
}

// The quantization kernel of a prologue known at run time.
static decltype(&gemv_il_quantize<GEMV_IL_PLAIN>) gemv_il_quantize_kernel(const gemv_il_prologue prologue) {
    switch (prologue) {
        case GEMV_IL_RMS_NORM:     return gemv_il_quantize<GEMV_IL_RMS_NORM>;
        case GEMV_IL_SWIGLU:       return gemv_il_quantize<GEMV_IL_SWIGLU>;
        case GEMV_IL_GATED_NORM:   return gemv_il_quantize<GEMV_IL_GATED_NORM>;
        case GEMV_IL_SIGMOID_GATE: return gemv_il_quantize<GEMV_IL_SIGMOID_GATE>;
        default:                   return gemv_il_quantize<GEMV_IL_PLAIN>;
    }
}

// Calls f(std::integral_constant<int, type>()) for a type known at run time: picks a kernel instance.
template <typename F>
static auto gemv_il_dispatch(const int type, F && f) {
    switch (type) {
        case GEMV_IL_Q4_0: return f(std::integral_constant<int, GEMV_IL_Q4_0>());
        case GEMV_IL_Q8_0: return f(std::integral_constant<int, GEMV_IL_Q8_0>());
        case GEMV_IL_Q4_K: return f(std::integral_constant<int, GEMV_IL_Q4_K>());
        case GEMV_IL_Q6_K: return f(std::integral_constant<int, GEMV_IL_Q6_K>());
        case GEMV_IL_W4A8: return f(std::integral_constant<int, GEMV_IL_W4A8>());
        default:           GGML_ABORT("gemv-il: unknown type %d", type);
    }
}

// Chunks per de-interleave CTA: their bytes in a row are a whole number of 16-byte units (Q6_K: 210 per chunk).
static __host__ __device__ constexpr int gemv_il_deinterleave_chunks(const int type) {
    return type == GEMV_IL_Q6_K ? 8 : 4;
}

// The ggml bytes of a full tile's interleaved chunks [0, nc) at s, gathered into shared memory with
// coalesced unit loads: row r's bytes of those chunks at plain + r*pitch + lead(r), each chunk's CRB after
// the last. 32-bit index math only: the generic re-layout's 64-bit divisions per word made it several
// times slower.
template <int type, typename Lead>
static __device__ void gemv_il_gather_rows(const uint8_t * s, const int nc, uint8_t * plain, const int pitch, Lead lead) {
    constexpr int CB  = gemv_il_chunk_bytes(type);
    constexpr int CRB = gemv_il_chunk_row_bytes(type);
    constexpr int UB  = gemv_il_quant_unit_bytes(type);
    constexpr int QW  = gemv_il_quant_bytes(type)/UB;
    constexpr int U   = QW + gemv_il_meta_bytes(type)/2; // units per chunk: quant units, then 2-byte meta
    for (int u = threadIdx.x; u < nc*U; u += blockDim.x) {
        const int cc = u / U, v = u % U;
        const bool is_q = v < QW;
        const gemv_il_src o = is_q ? gemv_il_quant_src(type, v) : gemv_il_meta_src(type, v - QW);
        const uint16_t * from = (const uint16_t *) (s + cc*CB + (is_q ? UB*v : gemv_il_quant_bytes(type) + 2*(v - QW)));
        uint16_t * to = (uint16_t *) (plain + o.row*pitch + lead(o.row) + cc*CRB + o.blk*gemv_il_block_bytes(type) + o.off);
        to[0] = from[0];
        if (is_q && UB == 4) {
            to[1] = from[1];
        }
    }
}

// Interleaved -> ggml rows for a prefill (out of place, full tiles only). CTA (tile, group of G chunks):
// the chunks are gathered in shared memory, where each row's bytes start at the same offset modulo 16 as
// in dst; then each of the 16 rows' bytes of those chunks is written as one contiguous run of 16-byte
// stores (byte stores only for the partial units at its ends, which the usual shapes do not have).
template <int type>
static __global__ void __launch_bounds__(256)
gemv_il_deinterleave(const uint8_t * src, uint8_t * dst, const int64_t k) {
    constexpr int G     = gemv_il_deinterleave_chunks(type);
    constexpr int CB    = gemv_il_chunk_bytes(type);
    constexpr int CRB   = gemv_il_chunk_row_bytes(type);
    constexpr int PITCH = (G*CRB + 15)/16*16 + 16;         // a row's run and its lead-in
    __shared__ __align__(16) uint8_t plain[GEMV_IL_TILE_ROWS*PITCH];

    const int nchunks = (int) (k/GEMV_IL_CHUNK_K);
    const int c0 = blockIdx.y*G, nc = min(G, nchunks - c0);
    const int64_t tile = (int64_t) blockIdx.x*gemv_il_tile_bytes(type, k);
    uint8_t * d = dst + tile + (int64_t) c0*CRB;
    const int64_t row_bytes = gemv_il_row_bytes(type, k);
    const auto lead = [&](const int r) { return (int) ((uintptr_t) (d + r*row_bytes) & 15); };
    gemv_il_gather_rows<type>(src + tile + (int64_t) c0*CB, nc, plain, PITCH, lead);
    __syncthreads();

    const int len = nc*CRB, units = PITCH/16; // 16-byte units per row, lead-in included
    for (int i = threadIdx.x; i < GEMV_IL_TILE_ROWS*units; i += blockDim.x) {
        const int r = i / units, lo = 16*(i % units), ld = lead(r);
        const int b0 = max(lo, ld), b1 = min(lo + 16, ld + len); // the run's bytes in this unit
        uint8_t * out = d + r*row_bytes - ld + lo;               // 16-byte aligned
        const uint8_t * in = plain + r*PITCH + lo;
        if (b1 - b0 == 16) {
            *(uint4 *) out = *(const uint4 *) in;
        } else {
            for (int b = b0; b < b1; ++b) {
                out[b - lo] = in[b - lo];
            }
        }
    }
}

static void gemv_il_deinterleave_cuda(const int type, const uint8_t * src, uint8_t * dst, const int64_t k, const int64_t ntiles,
                                      cudaStream_t stream) {
    const int G = gemv_il_deinterleave_chunks(type);
    const dim3 grid((unsigned) ntiles, (unsigned) ((k/GEMV_IL_CHUNK_K + G - 1)/G));
    gemv_il_dispatch(type, [&](auto t) { gemv_il_deinterleave<decltype(t)::value><<<grid, 256, 0, stream>>>(src, dst, k); });
    CUDA_CHECK(cudaGetLastError());
}

// Dynamic shared memory of gemv_il_relayout_tiles for tiles of k columns: the padded tile, then the chunk
// map (16-byte aligned: the tile is whole 16-byte units).
static size_t gemv_il_relayout_smem(const int type, const int64_t k) {
    return gemv_il_stage_bytes((int) gemv_il_tile_bytes(type, k)) + gemv_il_chunk_bytes(type)/2*sizeof(int);
}

// Full tiles from the interleaved layout to ggml's (to_plain) or back, in place, for a prefill: CTA t stages
// tile t in shared memory, then writes it in the other layout, 16 coalesced bytes a thread, their halfwords
// from gemv_il_relayout_unit_src. No memory beyond the CTA's.
template <int type, bool to_plain>
static __global__ void __launch_bounds__(512)
gemv_il_relayout_tiles(uint8_t * w, const int row_bytes) {
    extern __shared__ __align__(16) uint8_t smem[];
    const int tile_bytes = GEMV_IL_TILE_ROWS*row_bytes, units = tile_bytes/16;
    int * map = (int *) (smem + gemv_il_stage_bytes(tile_bytes));
    uint4 * tile = (uint4 *) (w + (int64_t) blockIdx.x*tile_bytes);
    for (int h = threadIdx.x; h < gemv_il_chunk_bytes(type)/2; h += blockDim.x) {
        gemv_il_relayout_map_entry(type, row_bytes, h, to_plain, map);
    }
    constexpr int IN_FLIGHT = 8; // loads a thread keeps in flight: the largest tiles run one CTA a SM
    for (int i0 = threadIdx.x; i0 < units; i0 += IN_FLIGHT*blockDim.x) {
        uint4 v[IN_FLIGHT];
#pragma unroll
        for (int j = 0; j < IN_FLIGHT; ++j) {
            if (i0 + j*(int) blockDim.x < units) {
                v[j] = tile[i0 + j*blockDim.x];
            }
        }
#pragma unroll
        for (int j = 0; j < IN_FLIGHT; ++j) {
            if (i0 + j*(int) blockDim.x < units) {
                *(uint4 *) (smem + gemv_il_stage_offset(16*(i0 + j*blockDim.x))) = v[j];
            }
        }
    }
    __syncthreads();
    const uint16_t * from = (const uint16_t *) smem;
    for (int i = threadIdx.x; i < units; i += blockDim.x) {
        int src[8];
        gemv_il_relayout_unit_src(type, row_bytes, map, i, to_plain, src);
        union { uint4 v; uint16_t h[8]; } out;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            out.h[e] = from[gemv_il_stage_offset(src[e])/2];
        }
        tile[i] = out.v;
    }
}

// The first ntiles full tiles of w (k columns), in place; the caller checks gemv_il_relayout_smem against
// the device's shared memory per block (smpbo). The first call on a device must not be inside a graph
// capture of the global mode (it raises the kernels' shared memory limit).
static void gemv_il_relayout_tiles_cuda(const int type, uint8_t * w, const int64_t k, const int64_t ntiles, const bool to_plain,
                                        cudaStream_t stream) {
    if (ntiles == 0) {
        return;
    }
    const size_t smem = gemv_il_relayout_smem(type, k), smpbo = ggml_cuda_info().devices[ggml_cuda_get_device()].smpbo;
    gemv_il_dispatch(type, [&](auto t) {
        constexpr int T = decltype(t)::value;
        const int row_bytes = (int) gemv_il_row_bytes(T, k);
        if (to_plain) {
            CUDA_SET_SHARED_MEMORY_LIMIT((gemv_il_relayout_tiles<T, true>), smpbo);
            gemv_il_relayout_tiles<T, true><<<(unsigned) ntiles, 512, smem, stream>>>(w, row_bytes);
        } else {
            CUDA_SET_SHARED_MEMORY_LIMIT((gemv_il_relayout_tiles<T, false>), smpbo);
            gemv_il_relayout_tiles<T, false><<<(unsigned) ntiles, 512, smem, stream>>>(w, row_bytes);
        }
    });
    CUDA_CHECK(cudaGetLastError());
}

// W4A8 rows -> Q8_0 rows at dst, for a prefill (upstream has no W4A8 kernel): the blocks of
// gemv_il_w4a8_q8_0, d in fp16. CTA (tile, group of G chunks), as the de-interleave: a full tile's
// chunks (interleaved) or the partial last tile's rows (ggml's layout) are gathered in shared memory,
// expanded there, and each row's Q8_0 blocks of those chunks (272 bytes a chunk, 16-byte aligned: k is a
// multiple of 256) written as one run of 16-byte stores. src, dst: the first row; luts: the level tables
// by codebook id, which ids index modulo its size, as in the GEMV.
static __global__ void __launch_bounds__(256)
gemv_il_w4a8_to_q8_0(const uint8_t * src, uint8_t * dst, const int8_t * const * luts, const int64_t k, const int64_t rows) {
    constexpr int type  = GEMV_IL_W4A8;
    constexpr int G     = gemv_il_deinterleave_chunks(type);
    constexpr int CRB   = gemv_il_chunk_row_bytes(type);
    constexpr int QB    = (GEMV_IL_CHUNK_K/32)*sizeof(block_q8_0); // a row's Q8_0 bytes of a chunk
    __shared__ __align__(16) uint8_t plain[GEMV_IL_TILE_ROWS*G*CRB];
    __shared__ __align__(16) uint8_t q8[GEMV_IL_TILE_ROWS*G*QB];

    const int nchunks = (int) (k/GEMV_IL_CHUNK_K);
    const int c0 = blockIdx.y*G, nc = min(G, nchunks - c0);
    const int64_t row0 = (int64_t) blockIdx.x*GEMV_IL_TILE_ROWS, row_bytes = gemv_il_row_bytes(type, k);
    const int nrows = (int) min((int64_t) GEMV_IL_TILE_ROWS, rows - row0);
    const uint8_t * s = src + row0*row_bytes;
    if (nrows == GEMV_IL_TILE_ROWS) {
        gemv_il_gather_rows<type>(s + (int64_t) c0*gemv_il_chunk_bytes(type), nc, plain, G*CRB, [](int) { return 0; });
    } else {
        for (int u = threadIdx.x; u < nrows*nc*CRB/2; u += blockDim.x) {
            const int r = u / (nc*CRB/2), v = u % (nc*CRB/2);
            ((uint16_t *) (plain + r*G*CRB))[v] = ((const uint16_t *) (s + r*row_bytes + (int64_t) c0*CRB))[v];
        }
    }
    __syncthreads();

    for (int i = threadIdx.x; i < nrows*nc*8; i += blockDim.x) {
        const int r = i / (nc*8), b = i % (nc*8);
        const uint8_t * blk = plain + r*G*CRB + (b/8)*CRB;
        const auto byte = [&](const int off) { return blk[off]; };
        float d;
        uint32_t qs[8];
        gemv_il_w4a8_q8_0(byte, luts[gemv_il_w4a8_word(byte, GEMV_IL_W4A8_CB) & (GEMV_IL_W4A8_CODEBOOKS - 1)], b % 8, d, qs);
        uint16_t * out = (uint16_t *) (q8 + r*G*QB + b*sizeof(block_q8_0)); // 2-byte aligned
        out[0] = __half_as_ushort(__float2half(d));
        for (int w = 0; w < 8; ++w) {
            out[1 + 2*w] = (uint16_t) qs[w];
            out[2 + 2*w] = (uint16_t) (qs[w] >> 16);
        }
    }
    __syncthreads();

    const int units = nc*QB/16; // 16-byte units of a row's run
    for (int i = threadIdx.x; i < nrows*units; i += blockDim.x) {
        const int r = i / units, u = i % units;
        *(uint4 *) (dst + (row0 + r)*(k/32)*(int64_t) sizeof(block_q8_0) + (int64_t) c0*QB + 16*u) = *(const uint4 *) (q8 + r*G*QB + 16*u);
    }
}

// Warps per CTA. A warp has S chunk loads in flight (its register stages), so a CTA lives about as many memory
// round trips as its warps have chunks over S, and a grid as many CTA lives as it has waves: pick the split
// with the fewest waves times round trips, at equal products the fewer waves (a shorter tail). One-wave splits
// of few warps left slots empty and made their warps walk 4 to 8 chunks: the 9B's qkv, in_proj and gate+up at
// S = 1 ran at 56-69% of the read ceiling with 4, 4 and 2 warps; 16, 16 and 8 took its Q4_0 token 3.4% faster
// and tg128 3.2% (bench/RESULTS.md, nineteenth session). Shapes of many waves (the output projection) take
// more, shorter CTAs instead: 4 / S warps, 4 chunk loads in flight a CTA. On the H200's 4096 x 248320 that is
// within 2% of the best split for Q4_0 (4 warps), Q6_K (4) and Q8_0 (2), and for Q4_K (2 warps at S = 2)
// 88% of the read ceiling where 4 warps gave 84%, W4A8 +1.6% (nineteenth session, the micro-benchmark's sweep).
// Every count from 2 to 16 is a candidate: the 27B's ffn_down fits 3 CTAs of 10 warps an SM where 8 warps took
// 9 round trips in one wave and 16 two waves of 5; its Q4_0 token's GEMVs -4.8%, the 9B's -0.3% (twentieth session).
// nsm: multiprocessors; ctas_per_sm(nwarps): occupancy.
template <typename F>
static int gemv_il_pick_nwarps(const int64_t n, const int64_t k, const int S, const int nsm, F ctas_per_sm) {
    const int64_t ntiles  = (n + GEMV_IL_TILE_ROWS - 1) / GEMV_IL_TILE_ROWS;
    const int64_t nchunks = k / GEMV_IL_CHUNK_K;
    const auto waves = [&](const int nw) {
        const int64_t slots = std::max<int64_t>(1, (int64_t) ctas_per_sm(nw)*nsm);
        return (ntiles + slots - 1) / slots;
    };
    if (nchunks >= 4 && waves(4) >= 8) {
        return std::max(1, 4 / S);
    }
    if (nchunks < 2) {
        return 1;
    }
    int best = 2;
    int64_t best_cost = INT64_MAX, best_waves = INT64_MAX;
    for (int nw = GEMV_IL_MAX_WARPS; nw >= 2; --nw) { // one warp a CTA was never the best split
        if (nw > nchunks) {
            continue;
        }
        const int64_t w = waves(nw), cost = w * (((nchunks + nw - 1) / nw + S - 1) / S);
        if (cost < best_cost || (cost == best_cost && w < best_waves)) {
            best       = nw;
            best_cost  = cost;
            best_waves = w;
        }
    }
    return best;
}
