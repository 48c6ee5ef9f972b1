// Decode attention for 1..8 query rows over an f16 KV cache, split over the cache within one launch (the
// seed article's decode kernel): CTA (h, s) takes kv head h's positions [s*chunk, (s + 1)*chunk) for the
// G = n_head/n_head_kv query heads that read it (ggml's grouping: query head h*G + g), R = G*n_q rows in all,
// and leaves each row's maximum score, sum of exponentials and exponential-weighted V sum; the last CTA of
// kv head h to finish (an arrival counter per kv head, which wraps back to 0) combines the splits and writes
// the rows. Upstream runs a vector kernel and a separate combine kernel: 8.9 + 2.8 us a layer on the H200 for
// a 9B decode token at depth 512 (bench/RESULTS.md, the census at 62ec107), mostly fixed cost.
// ggml calls it for FLASH_ATTN_EXT where it applies (pyqwen-fattn-decode.cu); bench/fattn_decode_bench.cu
// checks and times it standalone. NOT yet run on a GPU.
#pragma once

#include "common.cuh"

#include <algorithm>

#define PFA_THREADS  128 // 4 warps
#define PFA_MAX_ROWS 32  // G*n_q: 4 query heads a kv head (Qwen3.5) times 8 rows
#define PFA_SUB      64  // positions scored at a time (online softmax over a CTA's chunk)
#define PFA_BATCH    4   // positions a warp loads at once

struct pfa_args {
    const float  * q;        // query row i, head j, dim d at q[i*q_row + j*q_head + d]
    int64_t        q_row, q_head;
    const half   * k, * v;   // position p, kv head h, dim d at k[p*kv_pos + h*kv_head + d] (the same for v)
    int64_t        kv_pos, kv_head;
    const half   * mask;     // added to row i's score at p: mask[i*mask_row + p]; nullptr: none
    int64_t        mask_row;
    float        * dst;      // row i, head j, dim d at dst[i*dst_row + j*dst_head + d]
    int64_t        dst_row, dst_head;
    float        * partial;  // [kv head][split][R][D + 2]: weighted V sums, then max and sum
    unsigned int * arrivals; // [kv head]: zero, and left zero
    int            n_q, n_kv, n_head, n_head_kv, chunk;
    float          scale;
};

// Shared memory of a CTA: the scaled queries, then the scores of PFA_SUB positions, R rows of each.
static size_t pfa_smem(const int D, const int rows) {
    return (size_t) rows*(D + PFA_SUB)*sizeof(float);
}

// Positions a CTA: enough CTAs to cover the GPU twice, at least 32 positions each, and the combine's work
// (splits times rows, in the last CTA) bounded.
static int pfa_chunk(const int n_kv, const int n_head_kv, const int rows, const int nsm) {
    const int want = std::max(1, std::min(2*nsm/n_head_kv, 256/rows));
    return std::max(32, (n_kv + want - 1)/want);
}

// Another CTA's partial result, from L2 (volatile: past the SM's L1 on either vendor).
static __device__ __forceinline__ float pfa_load_l2(const float * p) {
    return *(const volatile float *) p;
}

template <int D>
static __global__ void __launch_bounds__(PFA_THREADS)
pyqwen_fattn_decode(const pfa_args a) {
    static_assert(D % PFA_THREADS == 0 && D % (2*WARP_SIZE) == 0, "whole dims a thread");
    constexpr int DL = D/WARP_SIZE;   // dims of a K row a lane reads
    constexpr int DT = D/PFA_THREADS; // dims of V a thread accumulates
    constexpr int NW = PFA_THREADS/WARP_SIZE;
    const int h = blockIdx.x, split = blockIdx.y, nsplit = gridDim.y;
    const int G = a.n_head/a.n_head_kv, R = G*a.n_q;
    const int t = threadIdx.x, lane = t % WARP_SIZE, warp = t / WARP_SIZE;
    const int p0 = split*a.chunk, p1 = min(a.n_kv, p0 + a.chunk);
    extern __shared__ float smem[];
    float * qs = smem;            // [R][D]
    float * sc = smem + R*D;      // [R][PFA_SUB]
    __shared__ float row_max[PFA_MAX_ROWS], row_sum[PFA_MAX_ROWS], corr[PFA_MAX_ROWS];
    __shared__ bool last;

    // row r = i*G + g: query row i of head h*G + g
    for (int e = t; e < R*D; e += PFA_THREADS) {
        const int r = e / D, d = e % D;
        qs[e] = a.q[(r / G)*a.q_row + (h*G + r % G)*a.q_head + d]*a.scale;
    }
    if (t < R) {
        row_max[t] = -INFINITY;
        row_sum[t] = 0.0f;
    }
    float acc[PFA_MAX_ROWS][DT] = {};
    __syncthreads();

    for (int b0 = p0; b0 < p1; b0 += PFA_SUB) {
        const int nb = min(PFA_SUB, p1 - b0);
        // scores: a warp PFA_BATCH positions at a time (their K loads in flight together), a lane DL dims of
        // each, a warp sum per row
        for (int pl0 = warp*PFA_BATCH; pl0 < nb; pl0 += NW*PFA_BATCH) {
            half2 kh[PFA_BATCH][DL/2];
#pragma unroll
            for (int u = 0; u < PFA_BATCH; ++u) {
                const half2 * kp = (const half2 *) (a.k + min(b0 + pl0 + u, p1 - 1)*a.kv_pos + h*a.kv_head + lane*DL);
#pragma unroll
                for (int j = 0; j < DL/2; ++j) {
                    kh[u][j] = kp[j];
                }
            }
#pragma unroll
            for (int u = 0; u < PFA_BATCH; ++u) {
                const int pl = pl0 + u;
                if (pl >= nb) { // uniform
                    break;
                }
                for (int r = 0; r < R; ++r) {
                    float s = 0.0f;
#pragma unroll
                    for (int j = 0; j < DL/2; ++j) {
                        const float2 f = __half22float2(kh[u][j]);
                        s += qs[r*D + lane*DL + 2*j]*f.x + qs[r*D + lane*DL + 2*j + 1]*f.y;
                    }
                    s = warp_reduce_sum(s);
                    if (lane == 0) {
                        sc[r*PFA_SUB + pl] = s + (a.mask ? __half2float(a.mask[(r / G)*a.mask_row + b0 + pl]) : 0.0f);
                    }
                }
            }
        }
        __syncthreads();
        // online softmax: each row's new maximum, the old sums' correction, the block's weights
        for (int r = warp; r < R; r += NW) {
            float m = -INFINITY;
            for (int pl = lane; pl < nb; pl += WARP_SIZE) {
                m = fmaxf(m, sc[r*PFA_SUB + pl]);
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
        // the weighted V sums: a thread DT dims of every row
#pragma unroll
        for (int r = 0; r < PFA_MAX_ROWS; ++r) {
            if (r < R) {
#pragma unroll
                for (int j = 0; j < DT; ++j) {
                    acc[r][j] *= corr[r];
                }
            }
        }
#pragma unroll 8
        for (int pl = 0; pl < nb; ++pl) {
            float vf[DT];
            const half * vp = a.v + (b0 + pl)*a.kv_pos + h*a.kv_head + t*DT;
#pragma unroll
            for (int j = 0; j < DT; ++j) {
                vf[j] = __half2float(vp[j]);
            }
#pragma unroll
            for (int r = 0; r < PFA_MAX_ROWS; ++r) {
                if (r < R) {
                    const float w = sc[r*PFA_SUB + pl];
#pragma unroll
                    for (int j = 0; j < DT; ++j) {
                        acc[r][j] += w*vf[j];
                    }
                }
            }
        }
        __syncthreads(); // sc is rewritten by the next block
    }

    float * part = a.partial + ((int64_t) h*nsplit + split)*R*(D + 2);
#pragma unroll
    for (int r = 0; r < PFA_MAX_ROWS; ++r) {
        if (r < R) {
#pragma unroll
            for (int j = 0; j < DT; ++j) {
                part[r*(D + 2) + t*DT + j] = acc[r][j];
            }
            if (t == 0) {
                part[r*(D + 2) + D]     = row_max[r];
                part[r*(D + 2) + D + 1] = row_sum[r];
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
    const float * all = a.partial + (int64_t) h*nsplit*R*(D + 2);
    for (int r = 0; r < R; ++r) {
        float M = -INFINITY;
        for (int s = 0; s < nsplit; ++s) {
            M = fmaxf(M, pfa_load_l2(all + ((int64_t) s*R + r)*(D + 2) + D));
        }
        float L = 0.0f, o[DT] = {};
        for (int s = 0; s < nsplit; ++s) {
            const float * ps = all + ((int64_t) s*R + r)*(D + 2);
            const float m = pfa_load_l2(ps + D);
            const float f = m == -INFINITY ? 0.0f : expf(m - M);
            L += f*pfa_load_l2(ps + D + 1);
#pragma unroll
            for (int j = 0; j < DT; ++j) {
                o[j] += f*pfa_load_l2(ps + t*DT + j);
            }
        }
        float * out = a.dst + (r / G)*a.dst_row + (h*G + r % G)*a.dst_head + t*DT;
#pragma unroll
        for (int j = 0; j < DT; ++j) {
            out[j] = L > 0.0f ? o[j]/L : 0.0f;
        }
    }
}
