// CUDA kernel of GGML_OP_PYQWEN_SAMPLE: one block per row, the picks of the CPU kernel
// (ggml-cpu/pyqwen-sample-cpu.c). Candidates are ranked by logit, then lowest id, and the draw
// walks them in that order, as on the CPU. Greedy is exact; sums are taken in another order than
// on the CPU, so a draw or a top-p cut within rounding distance of a cumulative boundary may
// round the other way.
//
// A row: (1) the logits become order-preserving integer keys in a scratch row, penalty applied;
// (2) argmax; (3) when few candidates can matter (top-k <= 1024, or a min-p floor) they are
// gathered into shared memory, sorted, and the chain runs there in rank order with double sums,
// as on the CPU; (4) otherwise every cut and the draw is a radix search over the keys for the
// first candidate in rank order whose running weight exceeds a target, with the weights in fixed
// point so the histogram sums are exact integers (and reproducible, whatever the atomics' order).
// Subnormal logits may be flushed to zero (ggml-cuda builds with -use_fast_math); a model's are not.
#include "pyqwen-sample.cuh"

#include "ggml-pyqwen.h"
#include "pyqwen-float-key.cuh"

#include <cfloat>
#include <cstdint>

typedef unsigned long long pqs_u64;

#define PQS_THREADS     1024
#define PQS_ITEMS       (2 * PQS_THREADS)  // shortlist capacity and radix bins: two per thread
#define PQS_DIGIT       11                 // bits per radix pass: PQS_ITEMS bins
#define PQS_MAX_VOCAB   (1 << 20)          // keeps a row's fixed-point rounding below 2^-22 of the best weight
#define PQS_KEY_NEG_INF 0x007fffffu
#define PQS_KEY_POS_INF 0xff800000u

static_assert(PQS_ITEMS == 1 << PQS_DIGIT, "one radix bin per shortlist slot");
static_assert(PQS_THREADS == WARP_SIZE * WARP_SIZE, "pqs_scan2 sums the warp totals in one warp");

static __device__ __forceinline__ pqs_u64 pqs_min(const pqs_u64 a, const pqs_u64 b) {
    return a < b ? a : b;
}

// The logit of a key (pyqwen_float_key) other than NaN's.
static __device__ __forceinline__ float pqs_logit(const uint32_t key) {
    return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

// Inclusive prefix sums over the block, two items per thread (thread t holds items 2t and 2t+1);
// returns the block's total. The order of the additions is fixed, so double sums are reproducible.
template <typename T>
static __device__ T pqs_scan2(T & a, T & b) {
    __shared__ T warp_sums[WARP_SIZE];
    const int lane = threadIdx.x % WARP_SIZE;
    const int warp = threadIdx.x / WARP_SIZE;
    const T own  = a + b;
    const T incl = warp_prefix_inclusive_sum<T>(own);
    T       excl = __shfl_up_sync(0xffffffff, incl, 1, WARP_SIZE);
    if (lane == 0) {
        excl = T(0);
    }
    if (lane == WARP_SIZE - 1) {
        warp_sums[warp] = incl;
    }
    __syncthreads();
    if (warp == 0) {
        const T s = warp_prefix_inclusive_sum<T>(warp_sums[lane]);
        ggml_cuda_syncwarp();
        warp_sums[lane] = s;  // what the warps up to this one hold
    }
    __syncthreads();
    const T total = warp_sums[WARP_SIZE - 1];
    a = (warp == 0 ? T(0) : warp_sums[warp - 1]) + excl + a;
    b = a + b;
    __syncthreads();  // warp_sums is reused by the next call
    return total;
}

// Ascending bitonic sort of n (a power of two) items in shared memory.
template <typename T>
static __device__ void pqs_sort(T * v, const int n) {
    for (int k = 2; k <= n; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < n / 2; i += PQS_THREADS) {
                const int  lo = 2 * i - (i & (j - 1));
                const bool up = (lo & k) == 0;
                const T    x  = v[lo];
                const T    y  = v[lo + j];
                if ((x > y) == up) {
                    v[lo]     = y;
                    v[lo + j] = x;
                }
            }
            __syncthreads();
        }
    }
}

// Smallest key whose untempered probability passes the min-p floor, with the CPU's test
// exp(l - lmax) >= min_p (monotone in l); kbest + 1 when not even the best passes.
static __device__ uint32_t pqs_min_p_key(const uint32_t kbest, const double lmax, const double floor_p) {
    const auto passes = [&](const uint32_t key) { return exp((double) pqs_logit(key) - lmax) >= floor_p; };
    if (!passes(kbest)) {
        return kbest + 1;
    }
    const double guess = lmax + log(floor_p);  // within an ulp or two of the answer
    uint32_t key = guess > -FLT_MAX ? min(pyqwen_float_key((float) guess), kbest) : PQS_KEY_NEG_INF + 1;
    while (key < kbest && !passes(key)) {
        key++;
    }
    while (key > PQS_KEY_NEG_INF && passes(key - 1)) {
        key--;
    }
    return key;
}

// Weight of a candidate in a radix search: 1 (counting), exp((l - lmax) / t) in fixed point
// (mass), or whether that exp is nonzero in double (drawable: the CPU's fallback pick).
enum pqs_weight_kind { PQS_COUNT, PQS_MASS, PQS_DRAWABLE };

struct pqs_weight {
    pqs_weight_kind kind;
    double          lmax;
    double          t;
    double          scale;   // 2^S: the fixed-point unit
    double          cutoff;  // exp below 2^-(S+2) rounds to 0: skip it

    __device__ pqs_u64 operator()(const uint32_t key) const {
        if (kind == PQS_COUNT) {
            return 1;
        }
        if (key == 0) {
            return 0;  // NaN: ranks as -inf on the CPU, weight 0
        }
        const double d = ((double) pqs_logit(key) - lmax) / t;
        if (kind == PQS_DRAWABLE) {
            return exp(d) != 0.0;
        }
        return d < cutoff ? 0 : (pqs_u64) (exp(d) * scale + 0.5);
    }
};

struct pqs_shared {
    union {
        uint32_t tmax[PQS_THREADS];  // ~(best key) of each thread: bounds the top-k threshold
        pqs_u64  list[PQS_ITEMS];    // shortlist: ~key << 32 | id, ascending = rank order
        pqs_u64  hist[PQS_ITEMS];    // radix pass: weight per digit
    };
    pqs_u64  best;                   // argmax: key << 32 | ~id
    pqs_u64  base;                   // radix search: weight ranked before the chosen digit
    uint32_t digit;
    uint32_t kmin;                   // min-p threshold key
    int      count;
    int      first;
    int      last;
};

// First candidate in rank order, among those ranked at or before lim, whose running weight exceeds
// target_of(total weight); returns its rank ~key << id_bits | id. Radix passes of PQS_DIGIT bits
// from the top: each pass weighs, per next digit, the candidates sharing the prefix found so far.
template <typename target_fn>
static __device__ pqs_u64 pqs_search(const uint32_t * keys, const int n, const int id_bits, const pqs_u64 lim,
                                     const pqs_weight weight, const target_fn target_of, pqs_shared & sh) {
    const int tid = threadIdx.x;
    pqs_u64 prefix = 0;
    pqs_u64 base   = 0;
    pqs_u64 target = 0;
    for (int hi = 32 + id_bits; hi > 0;) {
        const int lo = max(hi - PQS_DIGIT, 0);
        sh.hist[2 * tid]     = 0;
        sh.hist[2 * tid + 1] = 0;
        __syncthreads();
        for (int i = tid; i < n; i += PQS_THREADS) {
            const uint32_t key = keys[i];
            const pqs_u64  r   = (pqs_u64) ~key << id_bits | (uint32_t) i;
            if (r <= lim && r >> hi == prefix) {
                const pqs_u64 w = weight(key);
                if (w) {
                    atomicAdd(&sh.hist[(r >> lo) & ((1u << (hi - lo)) - 1)], w);
                }
            }
        }
        __syncthreads();
        const pqs_u64 h = sh.hist[2 * tid];
        pqs_u64 a = h;
        pqs_u64 b = sh.hist[2 * tid + 1];
        const pqs_u64 total = pqs_scan2(a, b);
        if (hi == 32 + id_bits) {
            const pqs_u64 t = target_of(total);
            target = t < total ? t : total - 1;  // total >= 1: the best is always a candidate
        }
        if (base + a - h <= target && target < base + a) {
            sh.digit = 2 * tid;
            sh.base  = base + a - h;
        }
        if (base + a <= target && target < base + b) {
            sh.digit = 2 * tid + 1;
            sh.base  = base + a;
        }
        __syncthreads();
        prefix = prefix << (hi - lo) | sh.digit;
        base   = sh.base;
        hi     = lo;
    }
    return prefix;
}

static __global__ void __launch_bounds__(PQS_THREADS) pyqwen_sample_f32(
        const char * __restrict__ logits, const int64_t s_logits,
        const char * __restrict__ params, const int64_t s_params,
        const char * __restrict__ history, const int64_t s_history, const int n_hist,
        const int n_vocab, uint32_t * __restrict__ scratch, int32_t * __restrict__ dst) {
    __shared__ pqs_shared sh;
    const int row = blockIdx.x;
    const int tid = threadIdx.x;

    const float   * l    = (const float   *) (logits  + row * s_logits);
    const float   * prm  = (const float   *) (params  + row * s_params);
    const int32_t * hist = (const int32_t *) (history + row * s_history);
    uint32_t      * keys = scratch + (int64_t) row * n_vocab;

    const float temp    = prm[GGML_PYQWEN_SAMPLE_TEMPERATURE];
    const float top_k   = prm[GGML_PYQWEN_SAMPLE_TOP_K];
    const float top_p   = prm[GGML_PYQWEN_SAMPLE_TOP_P];
    const float min_p   = prm[GGML_PYQWEN_SAMPLE_MIN_P];
    const float penalty = prm[GGML_PYQWEN_SAMPLE_REPEAT_PENALTY];
    const float uniform = prm[GGML_PYQWEN_SAMPLE_UNIFORM];

    if (tid == 0) {
        sh.best = 0;
    }
    for (int i = tid; i < n_vocab; i += PQS_THREADS) {
        keys[i] = pyqwen_float_key(l[i]);
    }
    if (penalty != 1.0f) {
        __syncthreads();
        // each distinct id of the history once; float arithmetic, rounded once as on the CPU
        for (int j = tid; j < n_hist; j += PQS_THREADS) {
            const int32_t t = hist[j];
            bool first = t >= 0 && t < n_vocab;
            for (int q = 0; q < j && first; ++q) {
                first = hist[q] != t;
            }
            if (first) {
                const double x = l[t];
                keys[t] = pyqwen_float_key((float) (l[t] > 0.0f ? x / penalty : x * penalty));
            }
        }
    }
    __syncthreads();

    // argmax, lowest id on ties; NaN (key 0) only when there is nothing else
    pqs_u64 best = 0;
    for (int i = tid; i < n_vocab; i += PQS_THREADS) {
        const pqs_u64 v = (pqs_u64) keys[i] << 32 | (uint32_t) ~i;
        best = v > best ? v : best;
    }
    sh.tmax[tid] = ~(uint32_t) (best >> 32);
#pragma unroll
    for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) {
        const pqs_u64 v = __shfl_xor_sync(0xffffffff, best, offset, WARP_SIZE);
        best = v > best ? v : best;
    }
    if (tid % WARP_SIZE == 0) {
        atomicMax(&sh.best, best);
    }
    __syncthreads();
    best = sh.best;
    const uint32_t kbest = best >> 32;
    const int32_t  ibest = (int32_t) ~(uint32_t) best;
    if (kbest == 0 || !(temp > 0.0f) || kbest == PQS_KEY_POS_INF || kbest == PQS_KEY_NEG_INF) {
        if (tid == 0) {
            dst[row] = kbest == 0 ? -1 : ibest;  // every logit NaN, greedy, or an infinite best
        }
        return;
    }

    const double lmax    = pqs_logit(kbest);
    const bool   topk_on = top_k >= 1.0f && top_k < (float) n_vocab;
    const int    k       = topk_on ? (int) top_k : n_vocab;
    const bool   topp_on = top_p < 1.0f;
    const bool   minp_on = min_p > 0.0f;
    const double floor_p = min_p;
    if (tid == 0 && minp_on) {
        sh.kmin = pqs_min_p_key(kbest, lmax, floor_p);
    }
    __syncthreads();

    // Few candidates can matter: the top k (each thread's best bounds the k-th best from below),
    // or those above the min-p floor (unless top-p needs a top-k total beyond them).
    const bool by_top_k = topk_on && k <= PQS_THREADS;
    if (by_top_k || (minp_on && !(topk_on && topp_on))) {
        uint32_t t0;
        if (by_top_k) {
            pqs_sort(sh.tmax, PQS_THREADS);
            t0 = ~sh.tmax[k - 1];
        } else {
            t0 = min(sh.kmin, kbest);
        }
        t0 = max(t0, 1u);  // NaN stays out: it could only fill the top k at probability 0
        if (tid == 0) {
            sh.count = 0;
        }
        __syncthreads();  // tmax is read; the shortlist overwrites it

        const bool need_rest = !topk_on && topp_on;  // top-p's total is over the whole row
        double rest = 0.0;
        for (int i = tid; i < n_vocab; i += PQS_THREADS) {
            const uint32_t key = keys[i];
            if (key >= t0) {
                const int s = atomicAdd(&sh.count, 1);
                if (s < PQS_ITEMS) {
                    sh.list[s] = (pqs_u64) ~key << 32 | (uint32_t) i;
                }
            } else if (need_rest && key != 0) {
                rest += exp((double) pqs_logit(key) - lmax);
            }
        }
        __syncthreads();
        const int c = sh.count;
        if (c <= PQS_ITEMS) {
            int n_sort = 1;
            while (n_sort < c) {
                n_sort <<= 1;
            }
            for (int s = c + tid; s < n_sort; s += PQS_THREADS) {
                sh.list[s] = ~(pqs_u64) 0;
            }
            __syncthreads();
            pqs_sort(sh.list, n_sort);

            // the CPU kernel's chain, positions 2t and 2t+1 of the ranking in thread t
            const int  j0 = 2 * tid;
            const int  j1 = j0 + 1;
            const auto logit_at = [&](const int j) { return (double) pqs_logit(~(uint32_t) (sh.list[j] >> 32)); };
            const int  kk = topk_on ? min(k, c) : c;
            const double p0 = j0 < kk ? exp(logit_at(j0) - lmax) : 0.0;
            const double p1 = j1 < kk ? exp(logit_at(j1) - lmax) : 0.0;
            double s0 = p0 + p1 + rest;
            double s1 = 0.0;
            const double sum = pqs_scan2(s0, s1);

            int m = kk;  // min-p keeps a prefix of the ranking, the best at least
            if (minp_on) {
                if (tid == 0) {
                    sh.count = 1;
                }
                __syncthreads();
                const int passing = (j0 >= 1 && j0 < kk && p0 >= floor_p) + (j1 < kk && p1 >= floor_p);
                if (passing) {
                    atomicAdd(&sh.count, passing);
                }
                __syncthreads();
                m = sh.count;
            }

            int n = m;  // top-p: the first position whose running share reaches top_p closes the list
            if (topp_on) {
                double acc0 = j0 < m ? p0 / sum : 0.0;
                double acc1 = j1 < m ? p1 / sum : 0.0;
                pqs_scan2(acc0, acc1);
                if (tid == 0) {
                    sh.first = m;
                }
                __syncthreads();
                const int hit = j0 < m && acc0 >= (double) top_p ? j0 : j1 < m && acc1 >= (double) top_p ? j1 : m;
                if (hit < m) {
                    atomicMin(&sh.first, hit);
                }
                __syncthreads();
                n = sh.first < m ? sh.first + 1 : m;
            }

            // the draw: first position whose running tempered mass exceeds uniform * total
            const double w0 = j0 < n ? exp((logit_at(j0) - lmax) / (double) temp) : 0.0;
            const double w1 = j1 < n ? exp((logit_at(j1) - lmax) / (double) temp) : 0.0;
            double cum0 = w0;
            double cum1 = w1;
            const double target = (double) uniform * pqs_scan2(cum0, cum1);
            if (tid == 0) {
                sh.first = n;
                sh.last  = 0;
            }
            __syncthreads();
            const int hit = j0 < n && target < cum0 ? j0 : j1 < n && target < cum1 ? j1 : n;
            if (hit < n) {
                atomicMin(&sh.first, hit);
            }
            const int drawable = j1 < n && w1 != 0.0 ? j1 : j0 < n && w0 != 0.0 ? j0 : 0;
            if (drawable > 0) {
                atomicMax(&sh.last, drawable);  // uniform outside [0, 1): the last drawable one
            }
            __syncthreads();
            if (tid == 0) {
                dst[row] = (int32_t) (uint32_t) sh.list[sh.first < n ? sh.first : sh.last];
            }
            return;
        }
        // more ties at the threshold than the shortlist holds: the general path below
    }

    // General path: radix searches over the whole row, weights in units of 2^-S with
    // S = 62 - id_bits, so that a row of at most 2^id_bits weights <= 1 sums below 2^62.
    const int     id_bits = n_vocab > 1 ? 32 - __clz(n_vocab - 1) : 1;
    const double  scale   = ldexp(1.0, 62 - id_bits);
    const double  cutoff  = -(64 - id_bits) * 0.6931471805599453;
    const pqs_u64 all     = ~(pqs_u64) 0;
    const pqs_u64 rank_best = (pqs_u64) ~kbest << id_bits | (uint32_t) ibest;

    pqs_u64 lim = all;
    if (topk_on) {
        lim = pqs_search(keys, n_vocab, id_bits, all, pqs_weight{PQS_COUNT, lmax, 1.0, scale, cutoff},
                         [=](pqs_u64) { return (pqs_u64) k - 1; }, sh);
    }
    const pqs_u64 lim_k = lim;
    if (minp_on) {
        const pqs_u64 lim_m = (pqs_u64) ~sh.kmin << id_bits | ((1u << id_bits) - 1);
        lim = pqs_min(lim, lim_m > rank_best ? lim_m : rank_best);
    }
    if (topp_on) {
        // over the top k (the CPU's total), reached no later than at the min-p cut
        const pqs_u64 cut = pqs_search(keys, n_vocab, id_bits, lim_k, pqs_weight{PQS_MASS, lmax, 1.0, scale, cutoff},
            [=](pqs_u64 total) {
                const double need = ceil((double) top_p * (double) total);  // running mass >= top_p * total
                return need > 1.0 ? (pqs_u64) need - 1 : (pqs_u64) 0;
            }, sh);
        lim = pqs_min(lim, cut);
    }
    pqs_u64 pick;
    if (uniform < 1.0f) {
        pick = pqs_search(keys, n_vocab, id_bits, lim, pqs_weight{PQS_MASS, lmax, (double) temp, scale, cutoff},
            [=](pqs_u64 total) {
                const double target = floor((double) uniform * (double) total);
                return target > 0.0 ? (pqs_u64) target : (pqs_u64) 0;
            }, sh);
    } else {
        pick = pqs_search(keys, n_vocab, id_bits, lim, pqs_weight{PQS_DRAWABLE, lmax, (double) temp, scale, cutoff},
                          [](pqs_u64 total) { return total - 1; }, sh);
    }
    if (tid == 0) {
        dst[row] = (int32_t) (pick & ((1u << id_bits) - 1));
    }
}

void ggml_cuda_op_pyqwen_sample(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * logits  = dst->src[0];
    const ggml_tensor * params  = dst->src[1];
    const ggml_tensor * history = dst->src[2];

    const int64_t n_vocab = logits->ne[0];
    const int64_t n_rows  = logits->ne[1];
    GGML_ASSERT(n_vocab <= PQS_MAX_VOCAB);
    if (n_rows == 0) {
        return;
    }

    ggml_cuda_pool_alloc<uint32_t> keys(ctx.pool(), n_vocab * n_rows);
    pyqwen_sample_f32<<<n_rows, PQS_THREADS, 0, ctx.stream()>>>(
        (const char *) logits->data,  logits->nb[1],
        (const char *) params->data,  params->nb[1],
        (const char *) history->data, history->nb[1], (int) history->ne[0],
        (int) n_vocab, keys.get(), (int32_t *) dst->data);
}

bool ggml_cuda_pyqwen_sample_supported(const ggml_tensor * op) {
    return op->src[0]->ne[0] <= PQS_MAX_VOCAB;
}
