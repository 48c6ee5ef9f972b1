// Decode attention for up to 8 query rows (query heads times tokens) over an f16 KV cache, split over the
// cache (the seed article's decode kernel): CTA (h, s) takes kv head h's positions
// [s*chunk, (s + 1)*chunk) for the G = n_head/n_head_kv query heads that read it (ggml's grouping: query head
// h*G + g), R = G*n_q rows in all, and leaves each row's maximum score, sum of exponentials and
// exponential-weighted V sum; a second kernel, pyqwen_fattn_combine, merges the splits and writes the rows.
// A CTA streams its positions as tiles of 32 K and V rows through PFA_STAGES buffers in shared memory (cp.async),
// the copies of the next tiles in flight while a tile is used, and takes the scores and the V sums on tensor
// cores: the rows are the m of the mma tiles (padded to 16), positions and dims their n. On the H200, for a 9B
// decode token, both kernels: 6.5 / 18.6 / 43.7 us a layer at depth 512 / 8448 / 32640; with the merge in the
// first kernel's last CTAs, 8.0 / 22.3 / 47.6; the same design in f32 FMAs, 11.3 / 31.5 / 85.3 at depth 512 /
// 8192 / 32640, bound by its instructions (bench/RESULTS.md). Upstream runs a vector kernel and a separate
// combine kernel: 8.9 + 2.8 us a layer at depth 512 (the census at 62ec107), mostly fixed cost.
// NVIDIA Ampere on (cp.async, mma.m16n8k16); ggml calls it for FLASH_ATTN_EXT where it applies
// (pyqwen-fattn-decode.cu); bench/fattn_decode_bench.cu checks and times it standalone.
#pragma once

#include "common.cuh"
#include "cp-async.cuh"

#include <algorithm>

// PFA_STAGES and PFA_MAX_SPLITS may be set at build time: fattn_decode_bench is built with other values to compare.
#ifndef PFA_STAGES
#define PFA_STAGES   2   // tiles of K and V in shared memory: the one being read and the next on its way (3 took
                         // as long on the H200, and 72 KB a CTA at D = 256 fits the 99 KB of Ampere's and Ada's
                         // desktop GPUs, where three stages' 108 KB sent them to upstream's kernels)
#endif // PFA_STAGES
#define PFA_THREADS    128 // 4 warps: a warp scores 8 positions of a tile and sums D/4 dims of V
#define PFA_TILE       32  // positions a tile (a lane each in the softmax)
#ifndef PFA_MAX_SPLITS
#define PFA_MAX_SPLITS 128 // splits of a kv head's positions, at most (a combine thread each): the H200's 3 CTAs an
                           // SM over 4 kv heads make 99
#endif // PFA_MAX_SPLITS
#define PFA_COMBINE_THREADS 256 // pyqwen_fattn_combine: a CTA merges PFA_COMBINE_DIMS dims of a row
#define PFA_COMBINE_DIMS    64
#define PFA_MAX_ROWS   8   // G*n_q, the m of the mma tiles (of 16): a decode token's 4 query heads a kv head (Qwen3.5) times 2
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

// Shared memory of a CTA: PFA_STAGES tiles of K and V rows, the queries (f16), the scores of a tile, the
// weights of a tile (f16).
static constexpr __host__ __device__ int pfa_stride(const int D) {
    return D + PFA_PAD;
}

static constexpr __host__ __device__ int pfa_p_stride() {
    return PFA_TILE + PFA_PAD; // 20 words: the 8 rows' words c of an mma fragment in 8 distinct bank quads
}

static constexpr __host__ __device__ int pfa_s_stride() {
    return PFA_TILE + 8; // floats: the 8 rows' float2 stores of a fragment 8 banks apart
}

static constexpr __host__ __device__ size_t pfa_smem(const int D) {
    return (size_t) (PFA_STAGES*2*PFA_TILE + PFA_MAX_ROWS)*pfa_stride(D)*sizeof(half) +
           (size_t) PFA_MAX_ROWS*pfa_s_stride()*sizeof(float) + (size_t) PFA_MAX_ROWS*pfa_p_stride()*sizeof(half);
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

template <int D>
static __global__ void __launch_bounds__(PFA_THREADS)
pyqwen_fattn_decode(const pfa_args a) {
#ifdef CP_ASYNC_AVAILABLE
    constexpr int NW   = PFA_THREADS/WARP_SIZE;
    constexpr int KS   = pfa_stride(D);              // a K, V or q row's stride in shared memory, halves
    constexpr int PS   = pfa_p_stride();
    constexpr int DW   = D/NW;                       // dims of V a warp sums
    constexpr int ROW  = pfa_row(D);
    constexpr int MR   = PFA_MAX_ROWS/NW;            // rows a warp takes in the softmax
    constexpr int SC   = pfa_s_stride();             // a row's stride in sc
    constexpr int RC   = D/8;                        // 16-byte chunks of a row
    static_assert(PFA_TILE == NW*8 && PFA_TILE == WARP_SIZE && DW % 16 == 0 && PFA_MAX_ROWS % NW == 0 &&
                  PFA_THREADS % RC == 0 && PFA_STAGES >= 1,
                  "a warp 8 positions (an mma's n) and whole 16-dim pairs of V, a lane a position in the softmax");
    const int h = blockIdx.x, split = blockIdx.y, nsplit = gridDim.y;
    const int G = a.n_head/a.n_head_kv, R = G*a.n_q;
    const int t = threadIdx.x, lane = t % WARP_SIZE, warp = t / WARP_SIZE, g = lane / 4, c = lane % 4;
    const int p0 = split*a.chunk, p1 = min(a.n_kv, p0 + a.chunk);
    const int ntiles = (p1 - p0 + PFA_TILE - 1)/PFA_TILE;
    extern __shared__ __align__(16) unsigned char pfa_smem_raw[];
    half  * tiles = (half *) pfa_smem_raw;                      // [PFA_STAGES][K, V][PFA_TILE][KS]
    half  * qh    = tiles + PFA_STAGES*2*PFA_TILE*KS;           // [PFA_MAX_ROWS][KS], zero past row R
    float * sc    = (float *) (qh + PFA_MAX_ROWS*KS);           // [PFA_MAX_ROWS][SC]: a tile's scores
    half  * ph    = (half *) (sc + PFA_MAX_ROWS*SC);            // [PFA_MAX_ROWS][PS]: a tile's weights, zero past row R
    __shared__ float row_max[PFA_MAX_ROWS], row_sum[PFA_MAX_ROWS], corr[PFA_MAX_ROWS];

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

    // row r = i*G + g: query row i of head h*G + g, scaled, as f16; the rows past R and the weights' zero
    for (int e = 4*t; e < PFA_MAX_ROWS*D; e += 4*PFA_THREADS) {
        const int r = e / D, d = e % D;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (r < R) {
            v = *(const float4 *) (a.q + (r / G)*a.q_row + (h*G + r % G)*a.q_head + d);
        }
        *(half2 *) (qh + r*KS + d)     = __floats2half2_rn(v.x*a.scale, v.y*a.scale);
        *(half2 *) (qh + r*KS + d + 2) = __floats2half2_rn(v.z*a.scale, v.w*a.scale);
    }
    for (int e = t; e < PFA_MAX_ROWS*PS; e += PFA_THREADS) {
        ph[e] = __float2half(0.0f);
    }
    if (t < R) {
        row_max[t] = -INFINITY;
        row_sum[t] = 0.0f;
    }
    __syncthreads();
    // the queries as mma A fragments (rows 8..15 are zero), for the CTA's life
    unsigned qa[D/16][2];
#pragma unroll
    for (int k = 0; k < D/16; ++k) {
        qa[k][0] = *(const unsigned *) (qh + g*KS + 16*k + 2*c);
        qa[k][1] = *(const unsigned *) (qh + g*KS + 16*k + 8 + 2*c);
    }
    float acc[DW/8][4] = {}; // O: rows g (and the zero rows g + 8), dims warp*DW + 8j + 2c, + 1
    // the mask at tile i of this warp's softmax rows, a lane a position; loaded a tile ahead of its use
    const auto load_mask = [&](const int i, float * mv) {
#pragma unroll
        for (int k = 0; k < MR; ++k) {
            const int r = warp + k*NW, p = p0 + i*PFA_TILE + lane;
            mv[k] = a.mask && r < R && p < p1 ? __half2float(a.mask[(r / G)*a.mask_row + p]) : 0.0f;
        }
    };
    float mv[MR];
    load_mask(0, mv);

    for (int i = 0; i < ntiles; ++i) {
        issue(i + PFA_STAGES - 1);
        pfa_wait<PFA_STAGES - 1>(); // this thread's copies of tile i have landed
        __syncthreads();            // and everyone's
        const half * kt = tiles + (i % PFA_STAGES)*2*PFA_TILE*KS, * vt = kt + PFA_TILE*KS;
        const int nb = min(PFA_TILE, p1 - p0 - i*PFA_TILE);
        // scores S = Q K^T of this warp's 8 positions: B = K^T, its column n is position 8*warp + n
        {
            float s0[4] = {}, s1[4] = {}; // even and odd 16-dim steps: two chains of dependent mmas, each half as long
#pragma unroll
            for (int k = 0; k < D/16; k += 2) {
                unsigned kb[4]; // dims 16k + 8m, m = 0..3, of the warp's 8 positions
                pfa_ldmatrix4<false>(kb, kt + (8*warp + lane % 8)*KS + 16*k + 8*(lane / 8));
                const unsigned a0[4] = {qa[k][0], 0u, qa[k][1], 0u}, a1[4] = {qa[k + 1][0], 0u, qa[k + 1][1], 0u};
                pfa_mma(s0, a0, kb[0], kb[1]);
                pfa_mma(s1, a1, kb[2], kb[3]);
            }
            *(float2 *) (sc + g*SC + 8*warp + 2*c) = make_float2(s0[0] + s1[0], s0[1] + s1[1]);
        }
        float mv_next[MR];
        load_mask(i + 1, mv_next);
        __syncthreads();
        // online softmax, a warp a row and a lane a position: the mask added, the row's new maximum, the old
        // sums' correction, the tile's weights (zero past the split) as f16
#pragma unroll
        for (int k = 0; k < MR; ++k) {
            const int r = warp + k*NW;
            if (r < R) {
                const float x = lane < nb ? sc[r*SC + lane] + mv[k] : -INFINITY;
                const float m = fmaxf(warp_reduce_max(x), row_max[r]);
                const float w = m == -INFINITY ? 0.0f : expf(x - m);
                ph[r*PS + lane] = __float2half(w);
                const float l = warp_reduce_sum(w);
                if (lane == 0) {
                    const float cr = row_max[r] == -INFINITY ? 0.0f : expf(row_max[r] - m);
                    corr[r] = cr;
                    row_sum[r] = row_sum[r]*cr + l;
                    row_max[r] = m;
                }
            }
            mv[k] = mv_next[k];
        }
        __syncthreads();
        // O = corr O + P V over this warp's DW dims: A = P (rows g), B = V, two 8-dim n tiles a 4-matrix load
        const float cg = g < R ? corr[g] : 0.0f;
#pragma unroll
        for (int j = 0; j < DW/8; ++j) {
            acc[j][0] *= cg;
            acc[j][1] *= cg;
        }
#pragma unroll
        for (int k = 0; k < PFA_TILE/16; ++k) {
            const unsigned pa[4] = {*(const unsigned *) (ph + g*PS + 16*k + 2*c), 0u, *(const unsigned *) (ph + g*PS + 16*k + 8 + 2*c), 0u};
#pragma unroll
            for (int j = 0; j < DW/8; j += 2) {
                unsigned vb[4]; // positions 16k + 8(m%2), dims warp*DW + 8(j + m/2), m = 0..3, transposed
                pfa_ldmatrix4<true>(vb, vt + (16*k + 8*((lane / 8) % 2) + lane % 8)*KS + warp*DW + 8*(j + lane / 16));
                pfa_mma(acc[j],     pa, vb[0], vb[1]);
                pfa_mma(acc[j + 1], pa, vb[2], vb[3]);
            }
        }
        __syncthreads(); // the stage, sc and ph are rewritten next tile
    }

    ggml_cuda_pdl_lc(); // the combine may launch: it waits for this grid to finish before it reads the partials

    // the partial rows: O's rows g < R, their maximum and sum
    float * part = a.partial + ((int64_t) h*nsplit + split)*R*ROW;
    if (g < R) {
#pragma unroll
        for (int j = 0; j < DW/8; ++j) {
            *(float2 *) (part + g*ROW + warp*DW + 8*j + 2*c) = make_float2(acc[j][0], acc[j][1]);
        }
    }
    if (t < R) {
        part[t*ROW + D]     = row_max[t];
        part[t*ROW + D + 1] = row_sum[t];
    }
#else
    GGML_UNUSED(a);
    NO_DEVICE_CODE;
#endif // CP_ASYNC_AVAILABLE
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
