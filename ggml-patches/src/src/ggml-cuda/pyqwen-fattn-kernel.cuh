// Decode attention for up to 32 query rows (query heads times tokens) over an f16 KV cache, split over the
// cache (the seed article's decode kernel): CTA (h, s) takes kv head h's positions
// [s*chunk, (s + 1)*chunk) for the G = n_head/n_head_kv query heads that read it (ggml's grouping: query head
// h*G + g), R = G*n_q rows in all, and leaves each row's maximum score, sum of exponentials and
// exponential-weighted V sum; a second kernel, pyqwen_fattn_combine, merges the splits and writes the rows.
// A CTA streams its positions as tiles of 32 K and V rows through PFA_STAGES buffers in shared memory (cp.async),
// the copies of the next tiles in flight while a tile is used, and takes the scores and the V sums on tensor
// cores: the rows are the m of one or two mma tiles of 16 (MT), positions and dims their n; a verify pass of
// 8 tokens (32 rows at Qwen3.5-9B's 4 query heads a kv head) reads the cache once, as a decode token does.
// On the H200, for a 9B decode token, both kernels: 6.5 / 18.6 / 43.7 us a layer at depth 512 / 8448 / 32640;
// with the merge in the first kernel's last CTAs, 8.0 / 22.3 / 47.6; the same design in f32 FMAs, 11.3 / 31.5 /
// 85.3 at depth 512 / 8192 / 32640, bound by its instructions (bench/RESULTS.md). Upstream runs a vector kernel
// and a separate combine kernel: 8.9 + 2.8 us a layer at depth 512 (the census at 62ec107), mostly fixed cost.
// NVIDIA Ampere on (cp.async, mma.m16n8k16); ggml calls it for FLASH_ATTN_EXT where it applies
// (pyqwen-fattn-decode.cu); bench/fattn_decode_bench.cu checks and times it standalone.
#pragma once

#include "common.cuh"
#include "cp-async.cuh"

#include <algorithm>

// PFA_STAGES and PFA_MAX_SPLITS may be set at build time: fattn_decode_bench is built with other values to compare.
#ifndef PFA_STAGES
#define PFA_STAGES   2   // tiles of K and V in shared memory: the one being read and the next on its way (3 took
                         // as long on the H200, and 70 KB a CTA at D = 256 fits the 99 KB of Ampere's and Ada's
                         // desktop GPUs, where three stages' 108 KB sent them to upstream's kernels)
#endif // PFA_STAGES
#define PFA_THREADS    128 // 4 warps: a warp scores 8 positions of a tile and sums D/4 dims of V
#define PFA_TILE       32  // positions a tile
#ifndef PFA_MAX_SPLITS
#define PFA_MAX_SPLITS 128 // splits of a kv head's positions, at most (a combine thread each): the H200's 3 CTAs an
                           // SM over 4 kv heads make 99
#endif // PFA_MAX_SPLITS
#define PFA_COMBINE_THREADS 256 // pyqwen_fattn_combine: a CTA merges PFA_COMBINE_DIMS dims of a row
#define PFA_COMBINE_DIMS    64
#define PFA_MAX_ROWS   32  // G*n_q in two m-tiles of 16: Qwen3.5-9B's 4 query heads a kv head times a verify pass's 8 tokens
#define PFA_ROW_THREADS 4  // threads a row in the softmax, 8 positions each
#define PFA_PAD        8   // halves after each K, V and q row in shared memory: rows 8 apart start 4 banks apart

struct pfa_args {
    const float  * q;        // query row i, head j, dim d at q[i*q_row + j*q_head + d] (16-byte aligned rows)
    int64_t        q_row, q_head;
    const half   * k, * v;   // position p, kv head h, dim d at k[p*kv_pos + h*kv_head + d] (the same for v)
    int64_t        kv_pos, kv_head;
    const half   * mask;     // added to row i's score at p: mask[i*mask_row + p]; nullptr: none
    int64_t        mask_row;
    float        * dst;      // row i, head j, dim d at dst[i*dst_row + j*dst_head + d]
    int64_t        dst_row, dst_head;
    float        * partial;  // [kv head][split][R][pfa_row(D)]: weighted V sums, max, sum, padding
    int            n_q, n_kv, n_head, n_head_kv, chunk;
    float          scale;
};

// A partial row's floats: D weighted V sums, the maximum and the sum, padded to whole float4s.
static constexpr __host__ __device__ int pfa_row(const int D) {
    return D + 4;
}

// Shared memory of a CTA: PFA_STAGES tiles of K and V rows, the scores of a tile, the weights of a tile (f16)
// and, past one m-tile, the queries (f16).
static constexpr __host__ __device__ int pfa_stride(const int D) {
    return D + PFA_PAD;
}

static constexpr __host__ __device__ int pfa_p_stride() {
    return PFA_TILE + PFA_PAD; // 20 words: the 8 rows of an ldmatrix in 8 distinct bank quads
}

static constexpr __host__ __device__ int pfa_s_stride() {
    return PFA_TILE + 8; // floats: the 8 rows' float2 stores of a fragment 8 banks apart
}

static constexpr __host__ __device__ size_t pfa_smem(const int D, const int MT) {
    return (size_t) (PFA_STAGES*2*PFA_TILE + (MT > 1 ? 16*MT : 0))*pfa_stride(D)*sizeof(half) +
           (size_t) 16*MT*pfa_s_stride()*sizeof(float) + (size_t) 16*MT*pfa_p_stride()*sizeof(half);
}

// The kernel's m-tiles of 16 for `rows` rows (at most PFA_MAX_ROWS).
static constexpr __host__ __device__ int pfa_m_tiles(const int rows) {
    return rows <= 16 ? 1 : 2;
}

static size_t pfa_partial_floats(const int D, const int n_head_kv, const int nsplit, const int rows) {
    return (size_t) n_head_kv*nsplit*rows*pfa_row(D);
}

// Positions a CTA, whole tiles: enough CTAs to fill every SM (ctas_per_sm of them fit one), at most PFA_MAX_SPLITS.
static int pfa_chunk(const int n_kv, const int n_head_kv, const int nsm, const int ctas_per_sm) {
    const int want  = std::max(1, std::min(ctas_per_sm*nsm/n_head_kv, PFA_MAX_SPLITS));
    const int tiles = ((n_kv + want - 1)/want + PFA_TILE - 1)/PFA_TILE;
    return tiles*PFA_TILE;
}

// cp.async in groups: pfa_commit closes this thread's group of copies, pfa_wait<n> returns when at most n of its
// groups are still in flight (cp-async.cuh has the copy itself, and no groups).
static __device__ __forceinline__ void pfa_commit() {
#ifdef CP_ASYNC_AVAILABLE
    asm volatile("cp.async.commit_group;");
#endif // CP_ASYNC_AVAILABLE
}

template <int n>
static __device__ __forceinline__ void pfa_wait() {
#ifdef CP_ASYNC_AVAILABLE
    asm volatile("cp.async.wait_group %0;" : : "n"(n));
#endif // CP_ASYNC_AVAILABLE
}

// The tensor-core steps, with g = lane/4 and c = lane%4. mma m16n8k16, f16 in and f32 out: a holds rows g and
// g + 8, columns 2c, 2c + 1 and 2c + 8, 2c + 9 of A (16 x 16, row-major); b holds rows 2c, 2c + 1 and 2c + 8,
// 2c + 9 of B (16 x 8) in column g; d holds rows g and g + 8, columns 2c and 2c + 1 of D.
static __device__ __forceinline__ void pfa_mma(float (&d)[4], const unsigned (&a)[4], const unsigned b0, const unsigned b1) {
#ifdef CP_ASYNC_AVAILABLE
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    GGML_UNUSED_VARS(d, a, b0, b1);
    NO_DEVICE_CODE;
#endif // CP_ASYNC_AVAILABLE
}

// Four 8 x 8 f16 matrices: lane l gives the address of row l%8 of matrix l/8; word w of the result is the
// matrix w's row g, columns 2c and 2c + 1, or with trans, its rows 2c and 2c + 1 of column g.
template <bool trans>
static __device__ __forceinline__ void pfa_ldmatrix4(unsigned (&r)[4], const half * row) {
#ifdef CP_ASYNC_AVAILABLE
    const unsigned addr = ggml_cuda_cvta_generic_to_shared((void *) row);
    if constexpr (trans) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
    } else {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
    }
#else
    GGML_UNUSED_VARS(r, row);
    NO_DEVICE_CODE;
#endif // CP_ASYNC_AVAILABLE
}

// MT: m-tiles of 16 rows; rows past R are zeros throughout and never stored.
template <int D, int MT>
static __global__ void __launch_bounds__(PFA_THREADS)
pyqwen_fattn_decode(const pfa_args a) {
#ifdef CP_ASYNC_AVAILABLE
    constexpr int NW   = PFA_THREADS/WARP_SIZE;
    constexpr int KS   = pfa_stride(D);              // a K, V or q row's stride in shared memory, halves
    constexpr int PS   = pfa_p_stride();
    constexpr int DW   = D/NW;                       // dims of V a warp sums
    constexpr int ROW  = pfa_row(D);
    constexpr int RP   = 16*MT;                      // rows, padded to whole m-tiles
    constexpr int SC   = pfa_s_stride();             // a row's stride in sc
    constexpr int RC   = D/8;                        // 16-byte chunks of a row
    constexpr int SQ   = PFA_TILE/PFA_ROW_THREADS;   // positions a thread takes in the softmax
    constexpr int SR   = PFA_THREADS/PFA_ROW_THREADS;// rows the softmax takes at a time
    constexpr int SP   = (RP + SR - 1)/SR;           // and its passes over the rows
    static_assert(PFA_TILE == NW*8 && DW % 16 == 0 && PFA_THREADS % RC == 0 && PFA_STAGES >= 2 && SQ == 8 &&
                  16*MT <= PFA_MAX_ROWS, "a warp 8 positions (an mma's n) and whole 16-dim pairs of V, 8 positions a softmax thread");
    const int h = blockIdx.x, split = blockIdx.y, nsplit = gridDim.y;
    const int G = a.n_head/a.n_head_kv, R = G*a.n_q;
    const int t = threadIdx.x, lane = t % WARP_SIZE, warp = t / WARP_SIZE, g = lane / 4, c = lane % 4;
    const int p0 = split*a.chunk, p1 = min(a.n_kv, p0 + a.chunk);
    const int ntiles = (p1 - p0 + PFA_TILE - 1)/PFA_TILE;
    extern __shared__ __align__(16) unsigned char pfa_smem_raw[];
    half  * tiles = (half *) pfa_smem_raw;                      // [PFA_STAGES][K, V][PFA_TILE][KS]
    float * sc    = (float *) (tiles + PFA_STAGES*2*PFA_TILE*KS); // [RP][SC]: a tile's scores
    half  * ph    = (half *) (sc + RP*SC);                      // [RP][PS]: a tile's weights, zero past row R
    half  * qh    = ph + RP*PS;                                 // [RP][KS], MT > 1: the queries
    __shared__ float row_max[RP], row_sum[RP], corr[RP];

    // tile i's K and V rows into stage i % PFA_STAGES, one group of copies a tile (an empty group past the last
    // tile, so that pfa_wait counts alike every tile); rows past the split repeat its last row, scored as masked
    const auto issue = [&](const int i) {
        if (i < ntiles) {
            half * stage = tiles + (i % PFA_STAGES)*2*PFA_TILE*KS;
            const int col = t % RC;
#pragma unroll
            for (int pl = t / RC; pl < PFA_TILE; pl += PFA_THREADS/RC) {
                const int64_t off = min(p0 + i*PFA_TILE + pl, p1 - 1)*a.kv_pos + h*a.kv_head + 8*col;
                cp_async_cg_16<0>(ggml_cuda_cvta_generic_to_shared(stage + pl*KS + 8*col), a.k + off);
                cp_async_cg_16<0>(ggml_cuda_cvta_generic_to_shared(stage + (PFA_TILE + pl)*KS + 8*col), a.v + off);
            }
        }
        pfa_commit();
    };
    ggml_cuda_pdl_sync(); // launched with PDL: the previous kernels' writes (the new K and V rows, q) are visible
#pragma unroll
    for (int i = 0; i < PFA_STAGES - 1; ++i) {
        issue(i);
    }

    // the queries, scaled, as f16 rows (zero past R): at one m-tile staged in the last K/V stage, whose first
    // copies the loop issues, and taken from there into registers as mma A fragments (rows g and g + 8) for the
    // CTA's life; at two in a region of their own, read a tile (their registers would not fit)
    half * qs = MT == 1 ? tiles + (PFA_STAGES - 1)*2*PFA_TILE*KS : qh;
    for (int e = 4*t; e < RP*D; e += 4*PFA_THREADS) {
        const int r = e / D, d = e % D;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (r < R) {
            v = *(const float4 *) (a.q + (r / G)*a.q_row + (h*G + r % G)*a.q_head + d);
        }
        *(half2 *) (qs + r*KS + d)     = __floats2half2_rn(v.x*a.scale, v.y*a.scale);
        *(half2 *) (qs + r*KS + d + 2) = __floats2half2_rn(v.z*a.scale, v.w*a.scale);
    }
    for (int r = t; r < RP; r += PFA_THREADS) {
        row_max[r] = -INFINITY;
        row_sum[r] = 0.0f;
    }
    __syncthreads();
    const auto q_ldmatrix = [&](unsigned (&f)[4], const int mt, const int k) {
        pfa_ldmatrix4<false>(f, qs + (16*mt + 8*((lane / 8) % 2) + lane % 8)*KS + 16*k + 8*(lane / 16));
    };
    [[maybe_unused]] unsigned qa[MT == 1 ? D/16 : 1][4];
    if constexpr (MT == 1) {
#pragma unroll
        for (int k = 0; k < D/16; ++k) {
            q_ldmatrix(qa[k], 0, k);
        }
        __syncthreads(); // the stage is free for the loop's copies
    }
    const auto q_frag = [&](unsigned (&f)[4], const int mt, const int k) {
        if constexpr (MT == 1) {
#pragma unroll
            for (int w = 0; w < 4; ++w) {
                f[w] = qa[k][w];
            }
        } else {
            q_ldmatrix(f, mt, k);
        }
    };
    float acc[MT][DW/8][4] = {}; // O: rows 16mt + g and + 8, dims warp*DW + 8j + 2c, + 1
    // the softmax's share of a thread: 8 positions (sq0 on) of rows t/PFA_ROW_THREADS + SR*k; the mask at tile i
    // there, loaded a tile ahead of its use, from rows found once (a division by G each: in the loop, the compiler
    // did it again for every position)
    const int sq0 = SQ*(t % PFA_ROW_THREADS);
    const half * mask_rows[SP];
#pragma unroll
    for (int k = 0; k < SP; ++k) {
        const int r = t / PFA_ROW_THREADS + SR*k;
        mask_rows[k] = a.mask && r < R ? a.mask + (r / G)*a.mask_row + p0 + sq0 : nullptr;
    }
    const auto load_mask = [&](const int i, float (*mv)[SQ]) {
#pragma unroll
        for (int k = 0; k < SP; ++k) {
#pragma unroll
            for (int e = 0; e < SQ; ++e) {
                const int p = i*PFA_TILE + e; // from p0 + sq0
                mv[k][e] = mask_rows[k] && p0 + sq0 + p < p1 ? __half2float(mask_rows[k][p]) : 0.0f;
            }
        }
    };
    float mv[SP][SQ];
    load_mask(0, mv);

    for (int i = 0; i < ntiles; ++i) {
        issue(i + PFA_STAGES - 1);
        pfa_wait<PFA_STAGES - 1>(); // this thread's copies of tile i have landed
        __syncthreads();            // and everyone's
        const half * kt = tiles + (i % PFA_STAGES)*2*PFA_TILE*KS, * vt = kt + PFA_TILE*KS;
        const int nb = min(PFA_TILE, p1 - p0 - i*PFA_TILE);
        // scores S = Q K^T of this warp's 8 positions: B = K^T, its column n is position 8*warp + n
        {
            float s0[MT][4] = {}, s1[MT][4] = {}; // even and odd 16-dim steps: two chains of dependent mmas, each half as long
#pragma unroll
            for (int k = 0; k < D/16; k += 2) {
                unsigned kb[4]; // dims 16k + 8m, m = 0..3, of the warp's 8 positions
                pfa_ldmatrix4<false>(kb, kt + (8*warp + lane % 8)*KS + 16*k + 8*(lane / 8));
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    unsigned a0[4], a1[4];
                    q_frag(a0, mt, k);
                    q_frag(a1, mt, k + 1);
                    pfa_mma(s0[mt], a0, kb[0], kb[1]);
                    pfa_mma(s1[mt], a1, kb[2], kb[3]);
                }
            }
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                *(float2 *) (sc + (16*mt + g)*SC + 8*warp + 2*c)     = make_float2(s0[mt][0] + s1[mt][0], s0[mt][1] + s1[mt][1]);
                *(float2 *) (sc + (16*mt + g + 8)*SC + 8*warp + 2*c) = make_float2(s0[mt][2] + s1[mt][2], s0[mt][3] + s1[mt][3]);
            }
        }
        float mv_next[SP][SQ];
        load_mask(i + 1, mv_next);
        __syncthreads();
        // online softmax, PFA_ROW_THREADS threads a row: the mask added, the row's new maximum, the old sums'
        // correction, the tile's weights (zero past the split) as f16. Rows past R see only -inf: weights 0.
#pragma unroll
        for (int k = 0; k < SP; ++k) {
            const int r = t / PFA_ROW_THREADS + SR*k;
            if (r < RP) { // uniform over a warp's rows
                float x[SQ], m = -INFINITY;
                const float4 s_lo = *(const float4 *) (sc + r*SC + sq0), s_hi = *(const float4 *) (sc + r*SC + sq0 + 4);
                const float s[SQ] = {s_lo.x, s_lo.y, s_lo.z, s_lo.w, s_hi.x, s_hi.y, s_hi.z, s_hi.w}; // 2 loads, not 8
#pragma unroll
                for (int e = 0; e < SQ; ++e) {
                    x[e] = r < R && sq0 + e < nb ? s[e] + mv[k][e] : -INFINITY;
                    m = fmaxf(m, x[e]);
                }
                m = warp_reduce_max<PFA_ROW_THREADS>(m);
                const float m_old = row_max[r];
                m = fmaxf(m, m_old);
                float l = 0.0f;
                unsigned w[SQ/2];
#pragma unroll
                for (int e = 0; e < SQ; e += 2) {
                    const float w0 = m == -INFINITY ? 0.0f : expf(x[e] - m), w1 = m == -INFINITY ? 0.0f : expf(x[e + 1] - m);
                    l += w0 + w1;
                    const half2 wh = __floats2half2_rn(w0, w1);
                    w[e/2] = *(const unsigned *) &wh;
                }
                *(uint4 *) (ph + r*PS + sq0) = make_uint4(w[0], w[1], w[2], w[3]);
                // not warp_reduce_sum<PFA_ROW_THREADS>: it adds the row's four partial sums in another order, and
                // the kernel's bits were checked and timed with this one
#pragma unroll
                for (int o = 1; o < PFA_ROW_THREADS; o <<= 1) {
                    l += __shfl_xor_sync(0xFFFFFFFF, l, o, WARP_SIZE);
                }
                if (t % PFA_ROW_THREADS == 0) {
                    const float cr = m_old == -INFINITY ? 0.0f : expf(m_old - m);
                    corr[r] = cr;
                    row_sum[r] = row_sum[r]*cr + l;
                    row_max[r] = m;
                }
            }
#pragma unroll
            for (int e = 0; e < SQ; ++e) {
                mv[k][e] = mv_next[k][e];
            }
        }
        __syncthreads();
        // O = corr O + P V over this warp's DW dims: A = P (rows 16mt + g, + 8), B = V, two 8-dim n tiles a
        // 4-matrix load
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            const float c0 = corr[16*mt + g], c1 = corr[16*mt + g + 8];
#pragma unroll
            for (int j = 0; j < DW/8; ++j) {
                acc[mt][j][0] *= c0;
                acc[mt][j][1] *= c0;
                acc[mt][j][2] *= c1;
                acc[mt][j][3] *= c1;
            }
        }
#pragma unroll
        for (int k = 0; k < PFA_TILE/16; ++k) {
            unsigned pa[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                pfa_ldmatrix4<false>(pa[mt], ph + (16*mt + 8*((lane / 8) % 2) + lane % 8)*PS + 16*k + 8*(lane / 16));
            }
#pragma unroll
            for (int j = 0; j < DW/8; j += 2) {
                unsigned vb[4]; // positions 16k + 8(m%2), dims warp*DW + 8(j + m/2), m = 0..3, transposed
                pfa_ldmatrix4<true>(vb, vt + (16*k + 8*((lane / 8) % 2) + lane % 8)*KS + warp*DW + 8*(j + lane / 16));
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    pfa_mma(acc[mt][j],     pa[mt], vb[0], vb[1]);
                    pfa_mma(acc[mt][j + 1], pa[mt], vb[2], vb[3]);
                }
            }
        }
        __syncthreads(); // the stage, sc and ph are rewritten next tile
    }

    ggml_cuda_pdl_lc(); // the combine may launch: it waits for this grid to finish before it reads the partials

    // the partial rows: O's rows below R, their maximum and sum
    float * part = a.partial + ((int64_t) h*nsplit + split)*R*ROW;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int half8 = 0; half8 < 2; ++half8) {
            const int r = 16*mt + g + 8*half8;
            if (r < R) {
#pragma unroll
                for (int j = 0; j < DW/8; ++j) {
                    *(float2 *) (part + r*ROW + warp*DW + 8*j + 2*c) = make_float2(acc[mt][j][2*half8], acc[mt][j][2*half8 + 1]);
                }
            }
        }
    }
    for (int r = t; r < R; r += PFA_THREADS) {
        part[r*ROW + D]     = row_max[r];
        part[r*ROW + D + 1] = row_sum[r];
    }
#else
    GGML_UNUSED(a);
    NO_DEVICE_CODE;
#endif // CP_ASYNC_AVAILABLE
}

// CTAs of pyqwen_fattn_decode<D, MT> that fit an SM together (3 at D = 256 and one m-tile on the H200, 1 on
// Ampere's and Ada's desktop GPUs), its shared memory limit raised first: what pfa_chunk's split is sized by.
template <int D, int MT>
static int pfa_occupancy() {
    CUDA_SET_SHARED_MEMORY_LIMIT((pyqwen_fattn_decode<D, MT>), pfa_smem(D, MT));
    int c = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&c, pyqwen_fattn_decode<D, MT>, PFA_THREADS, pfa_smem(D, MT)));
    return c;
}

// CTA (h, r, z) merges kv head h's row r over the splits, dims z*PFA_COMBINE_DIMS on, and writes them: each
// split's weight exp(m_s - M) from the maxima (a thread a split), then a thread a float4 column of every
// PFA_COMBINE_THREADS/(PFA_COMBINE_DIMS/4)-th split, summed in shared memory. A launch of its own: where the
// last CTAs of the first kernel to finish merged the splits (fences, atomics, serial rounds of loads), that
// took 4 us a layer at depth 512 and 7.5 us at depth 8448 on the H200 (bench/RESULTS.md, thirteenth session).
template <int D>
static __global__ void __launch_bounds__(PFA_COMBINE_THREADS)
pyqwen_fattn_combine(const pfa_args a) {
    constexpr int ROW = pfa_row(D), COLS = PFA_COMBINE_DIMS/4, PHASES = PFA_COMBINE_THREADS/COLS;
    static_assert(PFA_COMBINE_THREADS >= PFA_MAX_SPLITS && D % PFA_COMBINE_DIMS == 0, "a thread a split's weight");
    const int h = blockIdx.x, r = blockIdx.y, d0 = blockIdx.z*PFA_COMBINE_DIMS, t = threadIdx.x;
    const int G = a.n_head/a.n_head_kv, R = G*a.n_q, nsplit = (a.n_kv + a.chunk - 1)/a.chunk;
    const float * part = a.partial + ((int64_t) h*nsplit*R + r)*ROW; // split s's row at part + s*R*ROW
    __shared__ float w[PFA_MAX_SPLITS], red_max[WARP_SIZE], red_sum[WARP_SIZE];
    __shared__ float4 sums[PHASES][COLS];

    ggml_cuda_pdl_lc();   // the next kernels may launch: each waits for this grid before it reads the rows, and the
                          // output gate's quantization and wo's GEMV after it stream their first weights meanwhile
    ggml_cuda_pdl_sync(); // the partials
    const float2 ml = t < nsplit ? *(const float2 *) (part + (int64_t) t*R*ROW + D) : make_float2(-INFINITY, 0.0f);
    const float M  = block_reduce<block_reduce_method::MAX, PFA_COMBINE_THREADS>(ml.x, red_max);
    const float wt = ml.x == -INFINITY ? 0.0f : expf(ml.x - M); // split t's weight
    if (t < nsplit) {
        w[t] = wt;
    }
    const float L = block_reduce<block_reduce_method::SUM, PFA_COMBINE_THREADS>(wt*ml.y, red_sum);
    __syncthreads(); // w

    const int col = t % COLS, phase = t / COLS;
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 8
    for (int s = phase; s < nsplit; s += PHASES) {
        const float  ws = w[s];
        const float4 v  = *(const float4 *) (part + (int64_t) s*R*ROW + d0 + 4*col);
        o.x += ws*v.x;
        o.y += ws*v.y;
        o.z += ws*v.z;
        o.w += ws*v.w;
    }
    sums[phase][col] = o;
    __syncthreads();
    if (t < COLS) {
        float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int p = 0; p < PHASES; ++p) {
            sum.x += sums[p][t].x;
            sum.y += sums[p][t].y;
            sum.z += sums[p][t].z;
            sum.w += sums[p][t].w;
        }
        const float inv = L > 0.0f ? 1.0f/L : 0.0f;
        float * dst = a.dst + (r / G)*a.dst_row + (h*G + r % G)*a.dst_head + d0 + 4*t;
        dst[0] = sum.x*inv;
        dst[1] = sum.y*inv;
        dst[2] = sum.z*inv;
        dst[3] = sum.w*inv;
    }
}

// Both kernels for `rows` rows a kv head over nsplit splits of a.chunk positions, a.partial holding theirs, through
// ggml-cuda's launch (with PDL unless ggml_cuda_pdl_off): pyqwen-fattn-decode.cu's launch and fattn_decode_bench's.
template <int D, int MT>
static void pfa_launch(const pfa_args & a, const int nsplit, const int rows, cudaStream_t stream) {
    ggml_cuda_kernel_launch(pyqwen_fattn_decode<D, MT>,
        ggml_cuda_kernel_launch_params(dim3(a.n_head_kv, nsplit), dim3(PFA_THREADS), pfa_smem(D, MT), stream), a);
    ggml_cuda_kernel_launch(pyqwen_fattn_combine<D>,
        ggml_cuda_kernel_launch_params(dim3(a.n_head_kv, rows, D/PFA_COMBINE_DIMS), dim3(PFA_COMBINE_THREADS), 0, stream), a);
}
