// Decode attention for up to 8 query rows (query heads times tokens) over an f16 KV cache, split over the
// cache within one launch (the seed article's decode kernel): CTA (h, s) takes kv head h's positions [s*chunk, (s + 1)*chunk) for the
// G = n_head/n_head_kv query heads that read it (ggml's grouping: query head h*G + g), R = G*n_q rows in all,
// and leaves each row's maximum score, sum of exponentials and exponential-weighted V sum; the last CTA of
// kv head h to finish (an arrival counter per kv head, which wraps back to 0) combines the splits and writes
// the rows. Eight lanes share a K row (three shuffles a score, not five), and the combine reads the partials
// a float4 a thread with every split's load in flight (the first version, a lane a K dim and a thread a
// split at a time, took 24 us a layer at depth 512 on the H200, bench/RESULTS.md). Upstream runs a vector
// kernel and a separate combine kernel: 8.9 + 2.8 us a layer on the H200 for a 9B decode token at depth 512
// (bench/RESULTS.md, the census at 62ec107), mostly fixed cost.
// ggml calls it for FLASH_ATTN_EXT where it applies (pyqwen-fattn-decode.cu); bench/fattn_decode_bench.cu
// checks and times it standalone.
#pragma once

#include "common.cuh"

#include <algorithm>
#include <type_traits>

// PFA_THREADS and PFA_SUB may be set at build time: fattn_decode_bench is built with other values to compare.
#ifndef PFA_THREADS
#define PFA_THREADS  128 // 4 warps
#endif // PFA_THREADS
#ifndef PFA_SUB
#define PFA_SUB      64  // positions scored at a time (online softmax over a CTA's chunk); the most splits
#endif // PFA_SUB
#define PFA_MAX_ROWS 8   // G*n_q: a decode token's 4 query heads a kv head (Qwen3.5) times 2 rows
#define PFA_ROW_LANES 8  // lanes that share a K row, a lane D/8 of its dims

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

// A query row's floats in shared memory: 8 segments of D/8 dims, each padded by 4 floats so that the 8 lanes
// reading one float4 of their segments hit distinct banks.
static constexpr __host__ __device__ int pfa_q_row(const int D) {
    return PFA_ROW_LANES*(D/PFA_ROW_LANES + 4);
}

// Shared memory of a CTA: the scaled queries, then the scores of PFA_SUB positions, R rows of each.
static size_t pfa_smem(const int D, const int rows) {
    return (size_t) rows*(pfa_q_row(D) + PFA_SUB)*sizeof(float);
}

static size_t pfa_partial_floats(const int D, const int n_head_kv, const int nsplit, const int rows) {
    return (size_t) n_head_kv*nsplit*rows*pfa_row(D);
}

// Positions a CTA: enough CTAs to cover the GPU twice, at least 32 positions each, at most PFA_SUB splits (the
// combine's weights fill the score buffer). Deep caches want the splits: at depth 8192 on the H200, 64 splits
// took 34.6 us a layer and 32 (the combine's reads capped at 128 rows) 48.5 (bench/RESULTS.md).
static int pfa_chunk(const int n_kv, const int n_head_kv, const int nsm) {
    const int want = std::max(1, std::min(2*nsm/n_head_kv, PFA_SUB));
    return std::max(32, (n_kv + want - 1)/want);
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

template <int n>
static __device__ __forceinline__ void pfa_load_halves(const half * p, float * f) {
    pfa_to_floats<n>(*(const pfa_halves<n> *) p, f);
}

template <int D>
static __global__ void __launch_bounds__(PFA_THREADS)
pyqwen_fattn_decode(const pfa_args a) {
    constexpr int SEG  = D/PFA_ROW_LANES;            // dims of a K row a lane reads
    constexpr int QSEG = SEG + 4;                    // a segment's stride in qs
    constexpr int QROW = pfa_q_row(D), ROW = pfa_row(D);
    constexpr int PW   = WARP_SIZE/PFA_ROW_LANES;    // positions a warp scores at once
    constexpr int VD   = D/WARP_SIZE;                // dims of V a lane accumulates (a warp every NW-th position)
    constexpr int NW   = PFA_THREADS/WARP_SIZE;
    constexpr int COLS = D/4;                        // float4 columns of a row, in the combine
    constexpr int MR   = (PFA_MAX_ROWS + NW - 1)/NW;   // rows a warp takes in the softmax
    static_assert(SEG % 8 == 0 && (VD == 4 || VD == 8) && PFA_THREADS % COLS == 0 && PFA_SUB % WARP_SIZE == 0,
                  "whole uint4 K loads, uint2 or uint4 V loads, whole warps of a block's positions");
    const int h = blockIdx.x, split = blockIdx.y, nsplit = gridDim.y;
    const int G = a.n_head/a.n_head_kv, R = G*a.n_q;
    const int t = threadIdx.x, lane = t % WARP_SIZE, warp = t / WARP_SIZE;
    const int sub = lane % PFA_ROW_LANES, pw = lane / PFA_ROW_LANES; // a lane's K segment and position
    const int p0 = split*a.chunk, p1 = min(a.n_kv, p0 + a.chunk);
    extern __shared__ float smem[];
    float * qs = smem;            // [R][QROW]
    float * sc = smem + R*QROW;   // [R][PFA_SUB]: scores, then weights; in the combine, the splits' weights
    __shared__ float row_max[PFA_MAX_ROWS], row_sum[PFA_MAX_ROWS], corr[PFA_MAX_ROWS];
    __shared__ bool last;

    // row r = i*G + g: query row i of head h*G + g; a float4 a thread at a time, the loads unrolled so that
    // they are in flight together (q was just written: one L2 round trip, not one a float)
#pragma unroll 4
    for (int e = 4*t; e < R*D; e += 4*PFA_THREADS) {
        const int r = e / D, d = e % D;
        const float4 v = *(const float4 *) (a.q + (r / G)*a.q_row + (h*G + r % G)*a.q_head + d);
        *(float4 *) (qs + r*QROW + (d / SEG)*QSEG + d % SEG) = make_float4(v.x*a.scale, v.y*a.scale, v.z*a.scale, v.w*a.scale);
    }
    if (t < R) {
        row_max[t] = -INFINITY;
        row_sum[t] = 0.0f;
    }
    float acc[PFA_MAX_ROWS][VD] = {};
    __syncthreads();

    for (int b0 = p0; b0 < p1; b0 += PFA_SUB) {
        const int nb = min(PFA_SUB, p1 - b0);
        // this warp's V rows of the block and its rows' mask, loaded first: their latency passes under the
        // scores' K loads instead of following them
        pfa_halves<VD> vraw[PFA_SUB/NW];
#pragma unroll
        for (int i = 0; i < PFA_SUB/NW; ++i) {
            const int pl = min(warp + i*NW, nb - 1);
            vraw[i] = *(const pfa_halves<VD> *) (a.v + (b0 + pl)*a.kv_pos + h*a.kv_head + lane*VD);
        }
        float mv[MR][PFA_SUB/WARP_SIZE];
#pragma unroll
        for (int k = 0; k < MR; ++k) {
            const int r = warp + k*NW;
            const half * mrow = a.mask && r < R ? a.mask + (r / G)*a.mask_row + b0 : nullptr;
#pragma unroll
            for (int i = 0; i < PFA_SUB/WARP_SIZE; ++i) {
                const int pl = lane + i*WARP_SIZE;
                mv[k][i] = mrow && pl < nb ? __half2float(mrow[pl]) : 0.0f;
            }
        }
        // scores: a warp 2*PW positions a pass (their K loads in flight together), 8 lanes a position
        for (int pl0 = warp*2*PW; pl0 < nb; pl0 += NW*2*PW) {
            float kf[2][SEG];
#pragma unroll
            for (int u = 0; u < 2; ++u) {
                const int p = min(b0 + pl0 + u*PW + pw, p1 - 1);
#pragma unroll
                for (int j = 0; j < SEG/8; ++j) {
                    pfa_load_halves<8>(a.k + p*a.kv_pos + h*a.kv_head + sub*SEG + 8*j, &kf[u][8*j]);
                }
            }
            for (int r = 0; r < R; ++r) {
                const float4 * qp = (const float4 *) (qs + r*QROW + sub*QSEG);
                float s[2] = {0.0f, 0.0f};
#pragma unroll
                for (int j = 0; j < SEG/4; ++j) {
                    const float4 qv = qp[j];
#pragma unroll
                    for (int u = 0; u < 2; ++u) {
                        s[u] += qv.x*kf[u][4*j] + qv.y*kf[u][4*j + 1] + qv.z*kf[u][4*j + 2] + qv.w*kf[u][4*j + 3];
                    }
                }
#pragma unroll
                for (int u = 0; u < 2; ++u) {
#pragma unroll
                    for (int o = PFA_ROW_LANES/2; o > 0; o >>= 1) {
                        s[u] += __shfl_xor_sync(0xffffffff, s[u], o, WARP_SIZE);
                    }
                    const int pl = pl0 + u*PW + pw;
                    if (sub == 0 && pl < nb) {
                        sc[r*PFA_SUB + pl] = s[u];
                    }
                }
            }
        }
        __syncthreads();
        // online softmax, a warp a row: the mask added, each row's new maximum, the old sums' correction, the
        // block's weights
#pragma unroll
        for (int k = 0; k < MR; ++k) {
            const int r = warp + k*NW;
            if (r >= R) {
                break;
            }
            float m = -INFINITY;
#pragma unroll
            for (int i = 0; i < PFA_SUB/WARP_SIZE; ++i) {
                const int pl = lane + i*WARP_SIZE;
                if (pl < nb) {
                    sc[r*PFA_SUB + pl] += mv[k][i];
                    m = fmaxf(m, sc[r*PFA_SUB + pl]);
                }
            }
            m = fmaxf(warp_reduce_max(m), row_max[r]);
            float l = 0.0f;
            for (int pl = lane; pl < nb; pl += WARP_SIZE) {
                const float w = m == -INFINITY ? 0.0f : expf(sc[r*PFA_SUB + pl] - m);
                sc[r*PFA_SUB + pl] = w;
                l += w;
            }
            l = warp_reduce_sum(l);
            if (lane == 0) {
                const float c = row_max[r] == -INFINITY ? 0.0f : expf(row_max[r] - m);
                corr[r] = c;
                row_sum[r] = row_sum[r]*c + l;
                row_max[r] = m;
            }
        }
        __syncthreads();
        // the weighted V sums: a warp every NW-th position, a lane VD dims of every row, from the rows loaded
        // before the scores; the warps' sums meet once, after the last block
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
        for (int i = 0; i < PFA_SUB/NW; ++i) {
            const int pl = warp + i*NW;
            if (pl >= nb) {
                break;
            }
            float vf[VD];
            pfa_to_floats<VD>(vraw[i], vf);
#pragma unroll
            for (int r = 0; r < PFA_MAX_ROWS; ++r) {
                if (r < R) {
                    const float w = sc[r*PFA_SUB + pl];
#pragma unroll
                    for (int j = 0; j < VD; ++j) {
                        acc[r][j] += w*vf[j];
                    }
                }
            }
        }
        __syncthreads(); // sc is rewritten by the next block
    }

    // the warps' sums, one warp after another into smem (free now: R*D floats fit in qs), then warp 0 writes
    // the partial row
    float * red = smem;
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
            sc[r*PFA_SUB + s] = w;
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
            const float w = sc[r*PFA_SUB + s];
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
