// Decode attention for up to 8 query rows (query heads times tokens) over an f16 KV cache, split over the
// cache within one launch (the seed article's decode kernel): CTA (h, s) takes kv head h's positions
// [s*chunk, (s + 1)*chunk) for the G = n_head/n_head_kv query heads that read it (ggml's grouping: query head
// h*G + g), R = G*n_q rows in all, and leaves each row's maximum score, sum of exponentials and
// exponential-weighted V sum; the last CTA of kv head h to finish (an arrival counter per kv head, which wraps
// back to 0) combines the splits and writes the rows.
// A CTA streams its positions as tiles of 32 K and V rows through PFA_STAGES buffers in shared memory (cp.async):
// the copies of the next tiles are in flight while a tile is scored, so a CTA waits for memory once, not at
// every tile. The version before, which loaded K and V into registers a block at a time, read the cache at 944
// GB/s at depth 8192 and 1.4 TB/s at depth 32640 on the H200 (35.5 and 96.8 us a layer, bench/RESULTS.md).
// Upstream runs a vector kernel and a separate combine kernel: 8.9 + 2.8 us a layer on the H200 for a 9B decode
// token at depth 512 (bench/RESULTS.md, the census at 62ec107), mostly fixed cost.
// ggml calls it for FLASH_ATTN_EXT where it applies (pyqwen-fattn-decode.cu); bench/fattn_decode_bench.cu
// checks and times it standalone.
#pragma once

#include "common.cuh"
#include "cp-async.cuh"

#include <algorithm>
#include <type_traits>

// PFA_THREADS and PFA_STAGES may be set at build time: fattn_decode_bench is built with other values to compare.
#ifndef PFA_THREADS
#define PFA_THREADS  128 // 4 warps
#endif // PFA_THREADS
#ifndef PFA_STAGES
#if defined(GGML_USE_HIP)
#define PFA_STAGES   1   // no asynchronous copies: a second stage would only take LDS
#else
#define PFA_STAGES   3   // tiles of K and V in shared memory: the one being read and two on their way
#endif // defined(GGML_USE_HIP)
#endif // PFA_STAGES
#define PFA_TILE       32 // positions a tile (a lane each in the softmax)
#define PFA_MAX_SPLITS 64 // splits of a kv head's positions, at most (the combine's weights fill a row of sc)
#define PFA_MAX_ROWS   8  // G*n_q: a decode token's 4 query heads a kv head (Qwen3.5) times 2 rows
#define PFA_ROW_LANES  8  // lanes that share a K row, a lane its 16-byte chunks sub + 8j

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
    unsigned int * arrivals; // [kv head]: zero, and left zero
    int            n_q, n_kv, n_head, n_head_kv, chunk;
    float          scale;
};

// A partial row's floats: D weighted V sums, the maximum and the sum, padded to whole float4s.
static constexpr __host__ __device__ int pfa_row(const int D) {
    return D + 4;
}

// Where dim d of a query row sits in shared memory. Lane `sub` of a K row's 8 reads its 16-byte chunks sub + 8j
// and their 8 queries as two float4s; the 8 lanes' first float4s lie side by side, then their second ones, so
// that each quarter warp reads 128 contiguous bytes (no bank conflicts).
static __device__ __forceinline__ int pfa_q_index(const int d) {
    const int chunk = d / 8, e = d % 8;
    return (((chunk / PFA_ROW_LANES)*2 + e / 4)*PFA_ROW_LANES + chunk % PFA_ROW_LANES)*4 + e % 4;
}

// Shared memory of a CTA: PFA_STAGES tiles of K and V rows, then the scaled queries, then R rows of scores
// (in the combine: the splits' weights).
static size_t pfa_smem(const int D, const int rows) {
    return (size_t) PFA_STAGES*2*PFA_TILE*D*sizeof(half) + (size_t) rows*(D + PFA_MAX_SPLITS)*sizeof(float);
}

static size_t pfa_partial_floats(const int D, const int n_head_kv, const int nsplit, const int rows) {
    return (size_t) n_head_kv*nsplit*rows*pfa_row(D);
}

// Positions a CTA, whole tiles: enough CTAs to cover the GPU twice (two fit an SM), at most PFA_MAX_SPLITS.
static int pfa_chunk(const int n_kv, const int n_head_kv, const int nsm) {
    const int want  = std::max(1, std::min(2*nsm/n_head_kv, PFA_MAX_SPLITS));
    const int tiles = ((n_kv + want - 1)/want + PFA_TILE - 1)/PFA_TILE;
    return tiles*PFA_TILE;
}

// 16 bytes from global to shared memory: asynchronous where the GPU can (cp.async, sm_80 on), in a group that
// pfa_commit closes; pfa_wait<n> returns when at most n of this thread's groups are still in flight.
static __device__ __forceinline__ void pfa_copy16(void * dst, const void * src) {
#ifdef CP_ASYNC_AVAILABLE
    cp_async_cg_16<0>(ggml_cuda_cvta_generic_to_shared(dst), src);
#else
    *(uint4 *) dst = *(const uint4 *) src;
#endif // CP_ASYNC_AVAILABLE
}

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

// Another CTA's partial result, from L2 (HIP has no __ldcg: volatile, past the L1 on either vendor).
static __device__ __forceinline__ float pfa_load_l2(const float * p) {
#if defined(GGML_USE_HIP)
    return *(const volatile float *) p;
#else
    return __ldcg(p);
#endif // defined(GGML_USE_HIP)
}

static __device__ __forceinline__ float4 pfa_load_l2(const float4 * p) {
#if defined(GGML_USE_HIP)
    const volatile float * f = (const volatile float *) p;
    return make_float4(f[0], f[1], f[2], f[3]);
#else
    return __ldcg(p);
#endif // defined(GGML_USE_HIP)
}

// n halves (4 or 8, aligned to their size) in one load, and as floats.
template <int n>
using pfa_halves = std::conditional_t<n == 8, uint4, uint2>;

template <int n>
static __device__ __forceinline__ void pfa_to_floats(const pfa_halves<n> & raw, float * f) {
    static_assert(n == 4 || n == 8, "a uint2 or a uint4");
    const half2 * h2 = (const half2 *) &raw;
#pragma unroll
    for (int e = 0; e < n/2; ++e) {
        const float2 v = __half22float2(h2[e]);
        f[2*e]     = v.x;
        f[2*e + 1] = v.y;
    }
}

template <int D>
static __global__ void __launch_bounds__(PFA_THREADS)
pyqwen_fattn_decode(const pfa_args a) {
    constexpr int NCH  = D/(8*PFA_ROW_LANES);        // 16-byte chunks of a K row a lane reads
    constexpr int PW   = WARP_SIZE/PFA_ROW_LANES;    // positions a warp scores at once
    constexpr int NW   = PFA_THREADS/WARP_SIZE;
    constexpr int U    = PFA_TILE/(NW*PW);           // positions a lane scores a tile
    constexpr int VD   = D/WARP_SIZE;                // dims of V a lane accumulates (a warp every NW-th position)
    constexpr int ROW  = pfa_row(D);
    constexpr int COLS = D/4;                        // float4 columns of a row, in the combine
    constexpr int MR   = (PFA_MAX_ROWS + NW - 1)/NW; // rows a warp takes in the softmax
    constexpr int TC   = PFA_TILE*D/8;               // 16-byte chunks of a tile's K (or V) rows
    constexpr int SC   = PFA_MAX_SPLITS;             // a row's stride in sc
    static_assert(NCH >= 1 && U >= 1 && PFA_TILE % (NW*PW) == 0 && PFA_TILE == WARP_SIZE && (VD == 4 || VD == 8) &&
                  PFA_THREADS % COLS == 0 && (2*TC) % PFA_THREADS == 0 && PFA_STAGES >= 1 && SC >= PFA_TILE,
                  "whole chunks a lane, whole tiles a CTA, a lane a position in the softmax");
    const int h = blockIdx.x, split = blockIdx.y, nsplit = gridDim.y;
    const int G = a.n_head/a.n_head_kv, R = G*a.n_q;
    const int t = threadIdx.x, lane = t % WARP_SIZE, warp = t / WARP_SIZE;
    const int sub = lane % PFA_ROW_LANES, pw = lane / PFA_ROW_LANES; // a lane's K chunks and position
    const int p0 = split*a.chunk, p1 = min(a.n_kv, p0 + a.chunk);
    const int ntiles = (p1 - p0 + PFA_TILE - 1)/PFA_TILE;
    extern __shared__ __align__(16) unsigned char pfa_smem_raw[];
    half  * tiles = (half *) pfa_smem_raw;                       // [PFA_STAGES][K, V][PFA_TILE][D]
    float * qs    = (float *) (tiles + PFA_STAGES*2*PFA_TILE*D); // [R][D], a row's dims placed by pfa_q_index
    float * sc    = qs + R*D;                                    // [R][SC]: scores, then weights
    __shared__ float row_max[PFA_MAX_ROWS], row_sum[PFA_MAX_ROWS], corr[PFA_MAX_ROWS];
    __shared__ bool last;

    // tile i's K and V rows into stage i % PFA_STAGES, one group of copies a tile (an empty group past the last
    // tile, so that pfa_wait counts alike every tile); rows past the split repeat its last row, scored as masked
    const auto issue = [&](const int i) {
        if (i < ntiles) {
            half * stage = tiles + (i % PFA_STAGES)*2*PFA_TILE*D;
#pragma unroll
            for (int c = t; c < 2*TC; c += PFA_THREADS) {
                const int kv = c / TC, pl = c % TC / (D/8), col = c % (D/8);
                const int64_t p = min(p0 + i*PFA_TILE + pl, p1 - 1);
                pfa_copy16(stage + (kv*PFA_TILE + pl)*D + 8*col, (kv ? a.v : a.k) + p*a.kv_pos + h*a.kv_head + 8*col);
            }
        }
        pfa_commit();
    };
#pragma unroll
    for (int i = 0; i < PFA_STAGES - 1; ++i) {
        issue(i);
    }

    // row r = i*G + g: query row i of head h*G + g; a float4 a thread at a time, the loads unrolled so that
    // they are in flight together (q was just written: one L2 round trip, not one a float)
#pragma unroll 4
    for (int e = 4*t; e < R*D; e += 4*PFA_THREADS) {
        const int r = e / D, d = e % D;
        const float4 v = *(const float4 *) (a.q + (r / G)*a.q_row + (h*G + r % G)*a.q_head + d);
        *(float4 *) (qs + r*D + pfa_q_index(d)) = make_float4(v.x*a.scale, v.y*a.scale, v.z*a.scale, v.w*a.scale);
    }
    if (t < R) {
        row_max[t] = -INFINITY;
        row_sum[t] = 0.0f;
    }
    float acc[PFA_MAX_ROWS][VD] = {};
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
        const half * kt = tiles + (i % PFA_STAGES)*2*PFA_TILE*D, * vt = kt + PFA_TILE*D;
        const int nb = min(PFA_TILE, p1 - p0 - i*PFA_TILE);
        // scores: lane group pw of warp w takes positions (w*U + u)*PW + pw, 8 lanes a position
        float kf[U][8*NCH];
#pragma unroll
        for (int u = 0; u < U; ++u) {
#pragma unroll
            for (int j = 0; j < NCH; ++j) {
                pfa_to_floats<8>(*(const uint4 *) (kt + ((warp*U + u)*PW + pw)*D + 8*(sub + PFA_ROW_LANES*j)), &kf[u][8*j]);
            }
        }
        for (int r = 0; r < R; ++r) {
            const float4 * qp = (const float4 *) (qs + r*D);
            float s[U] = {};
#pragma unroll
            for (int j = 0; j < NCH; ++j) {
                const float4 q0 = qp[2*j*PFA_ROW_LANES + sub], q1 = qp[(2*j + 1)*PFA_ROW_LANES + sub];
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const float * kj = &kf[u][8*j];
                    s[u] += q0.x*kj[0] + q0.y*kj[1] + q0.z*kj[2] + q0.w*kj[3] + q1.x*kj[4] + q1.y*kj[5] + q1.z*kj[6] + q1.w*kj[7];
                }
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
#pragma unroll
                for (int o = PFA_ROW_LANES/2; o > 0; o >>= 1) {
                    s[u] += __shfl_xor_sync(0xffffffff, s[u], o, WARP_SIZE);
                }
                if (sub == 0) {
                    sc[r*SC + (warp*U + u)*PW + pw] = s[u];
                }
            }
        }
        float mv_next[MR];
        load_mask(i + 1, mv_next);
        __syncthreads();
        // online softmax, a warp a row and a lane a position: the mask added, the row's new maximum, the old
        // sums' correction, the tile's weights (zero past the split)
#pragma unroll
        for (int k = 0; k < MR; ++k) {
            const int r = warp + k*NW;
            if (r >= R) {
                break;
            }
            const float x = lane < nb ? sc[r*SC + lane] + mv[k] : -INFINITY;
            const float m = fmaxf(warp_reduce_max(x), row_max[r]);
            const float w = m == -INFINITY ? 0.0f : expf(x - m);
            sc[r*SC + lane] = w;
            const float l = warp_reduce_sum(w);
            if (lane == 0) {
                const float c = row_max[r] == -INFINITY ? 0.0f : expf(row_max[r] - m);
                corr[r] = c;
                row_sum[r] = row_sum[r]*c + l;
                row_max[r] = m;
            }
            mv[k] = mv_next[k];
        }
        __syncthreads();
        // the weighted V sums: a warp every NW-th position, a lane VD dims of every row; the warps' sums meet
        // once, after the last tile
#pragma unroll
        for (int r = 0; r < PFA_MAX_ROWS; ++r) {
            if (r < R) {
#pragma unroll
                for (int j = 0; j < VD; ++j) {
                    acc[r][j] *= corr[r];
                }
            }
        }
#pragma unroll
        for (int jj = 0; jj < PFA_TILE/NW; ++jj) {
            const int pl = warp + jj*NW;
            float vf[VD];
            pfa_to_floats<VD>(*(const pfa_halves<VD> *) (vt + pl*D + lane*VD), vf);
#pragma unroll
            for (int r = 0; r < PFA_MAX_ROWS; ++r) {
                if (r < R) {
                    const float w = sc[r*SC + pl];
#pragma unroll
                    for (int j = 0; j < VD; ++j) {
                        acc[r][j] += w*vf[j];
                    }
                }
            }
        }
        __syncthreads(); // the stage and sc are rewritten next tile
    }

    // the warps' sums, one warp after another into qs (free now), then warp 0 writes the partial row
    float * red = qs;
    for (int w = 1; w < NW; ++w) {
        if (warp == w) {
#pragma unroll
            for (int r = 0; r < PFA_MAX_ROWS; ++r) {
                if (r < R) {
#pragma unroll
                    for (int j = 0; j < VD; ++j) {
                        red[r*D + lane*VD + j] = (w == 1 ? 0.0f : red[r*D + lane*VD + j]) + acc[r][j];
                    }
                }
            }
        }
        __syncthreads();
    }
    float * part = a.partial + ((int64_t) h*nsplit + split)*R*ROW;
    if (warp == 0) {
#pragma unroll
        for (int r = 0; r < PFA_MAX_ROWS; ++r) {
            if (r < R) {
#pragma unroll
                for (int j = 0; j < VD; ++j) {
                    part[r*ROW + lane*VD + j] = acc[r][j] + red[r*D + lane*VD + j];
                }
                if (lane == 0) {
                    part[r*ROW + D]     = row_max[r];
                    part[r*ROW + D + 1] = row_sum[r];
                }
            }
        }
    }

    // the last CTA of kv head h combines the splits
    __threadfence();
    __syncthreads();
    if (t == 0) {
        last = atomicInc(&a.arrivals[h], (unsigned int) nsplit - 1) == (unsigned int) nsplit - 1;
    }
    __syncthreads();
    if (!last) {
        return;
    }
    __threadfence();
    const float * all = a.partial + (int64_t) h*nsplit*R*ROW;
    // a warp a row: the splits' weights exp(m_s - M) into sc, the row's total into row_sum
    for (int r = warp; r < R; r += NW) {
        float M = -INFINITY;
        for (int s = lane; s < nsplit; s += WARP_SIZE) {
            M = fmaxf(M, pfa_load_l2(all + ((int64_t) s*R + r)*ROW + D));
        }
        M = warp_reduce_max(M);
        float L = 0.0f;
        for (int s = lane; s < nsplit; s += WARP_SIZE) {
            const float * ps = all + ((int64_t) s*R + r)*ROW;
            const float m = pfa_load_l2(ps + D);
            const float w = m == -INFINITY ? 0.0f : expf(m - M);
            sc[r*SC + s] = w;
            L += w*pfa_load_l2(ps + D + 1);
        }
        L = warp_reduce_sum(L);
        if (lane == 0) {
            row_sum[r] = L;
        }
    }
    __syncthreads();
    // a thread a float4 column of PFA_THREADS/COLS rows at a time, sixteen splits' loads in flight (the last
    // CTA's reads are the launch's serial tail: 64 splits x 4 rows x 1 KB at depth 8192)
    const int c = t % COLS;
    for (int r = t / COLS; r < R; r += PFA_THREADS/COLS) {
        float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 16
        for (int s = 0; s < nsplit; ++s) {
            const float w = sc[r*SC + s];
            const float4 v = pfa_load_l2((const float4 *) (all + ((int64_t) s*R + r)*ROW) + c);
            o.x += w*v.x;
            o.y += w*v.y;
            o.z += w*v.z;
            o.w += w*v.w;
        }
        const float inv = row_sum[r] > 0.0f ? 1.0f/row_sum[r] : 0.0f;
        float * out = a.dst + (r / G)*a.dst_row + (h*G + r % G)*a.dst_head + 4*c;
        out[0] = o.x*inv;
        out[1] = o.y*inv;
        out[2] = o.z*inv;
        out[3] = o.w*inv;
    }
}
