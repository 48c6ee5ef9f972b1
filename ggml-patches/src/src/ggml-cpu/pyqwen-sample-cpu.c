// CPU kernel of GGML_OP_PYQWEN_SAMPLE: rows are spread over the threads, each thread owns a
// slice of the work buffer big enough for one row (candidates + probabilities).
//
// The order of the sampler chain and its arithmetic (float penalty, double probabilities, the
// `acc >= top_p` and `target < acc` tests) follow pyqwen's former host sampler exactly; the
// kernel only avoids work that cannot change the result: greedy is a linear scan, top-k is a
// selection, and with min-p on only the candidates above the min-p floor are sorted.
#include "pyqwen-sample-cpu.h"

#include "ggml-cpu-impl.h"
#include "ggml-pyqwen.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

struct pqs_cand {
    float   logit;
    int32_t id;
};

// ranking: larger logit first, then lower id (a total order once NaNs are gone)
static inline int pqs_before(const struct pqs_cand * a, const struct pqs_cand * b) {
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static int pqs_cmp(const void * pa, const void * pb) {
    const struct pqs_cand * a = pa, * b = pb;
    return pqs_before(a, b) ? -1 : pqs_before(b, a) ? 1 : 0;
}

// Moves the k best of c[0..n) to c[0..k), in no particular order. A small k keeps a heap of the
// k best so far at the front (one comparison for most candidates); a large k uses quickselect.
static void pqs_heap_down(struct pqs_cand * h, int64_t k, int64_t i) {
    // h[0] is the worst of the kept candidates
    for (;;) {
        int64_t w = i;
        const int64_t l = 2 * i + 1, r = l + 1;
        if (l < k && pqs_before(&h[w], &h[l])) w = l;
        if (r < k && pqs_before(&h[w], &h[r])) w = r;
        if (w == i) return;
        const struct pqs_cand t = h[i]; h[i] = h[w]; h[w] = t;
        i = w;
    }
}

static void pqs_select(struct pqs_cand * c, int64_t n, int64_t k) {
    if (k <= n / 16) {
        for (int64_t i = k / 2 - 1; i >= 0; --i) {
            pqs_heap_down(c, k, i);
        }
        for (int64_t i = k; i < n; ++i) {
            if (pqs_before(&c[i], &c[0])) {
                const struct pqs_cand t = c[0]; c[0] = c[i]; c[i] = t;
                pqs_heap_down(c, k, 0);
            }
        }
        return;
    }
    int64_t lo = 0, hi = n - 1;
    while (lo < hi) {
        const struct pqs_cand pivot = c[lo + (hi - lo) / 2];
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (pqs_before(&c[i], &pivot)) i++;
            while (pqs_before(&pivot, &c[j])) j--;
            if (i <= j) {
                const struct pqs_cand t = c[i]; c[i] = c[j]; c[j] = t;
                i++; j--;
            }
        }
        if (k - 1 <= j) {
            hi = j;
        } else if (k - 1 >= i) {
            lo = i;
        } else {
            break;
        }
    }
}

// Top-p needs the ranking only up to its cut. Buckets of the untempered probability by distance
// to the best logit tell which prefix of the ranking surely holds the cut (with a margin far above
// the rounding of the running sum); that prefix is moved to the front and only it gets sorted.
#define PQS_N_BUCKETS      64
#define PQS_BUCKETS_PER_LN 2.0
#define PQS_DIRECT_SORT    512

static inline int pqs_bucket(float logit, double lmax) {
    const double d = (lmax - (double) logit) * PQS_BUCKETS_PER_LN;
    return d < (double) (PQS_N_BUCKETS - 1) ? (int) d : PQS_N_BUCKETS - 1;
}

static int64_t pqs_top_p_prefix(struct pqs_cand * c, const double * p, int64_t m, double lmax, double sum, float top_p) {
    double mass[PQS_N_BUCKETS] = { 0 };
    for (int64_t i = 0; i < m; ++i) {
        mass[pqs_bucket(c[i].logit, lmax)] += p[i];
    }
    const double need = ((double) top_p + 1e-9) * sum;
    double acc = 0.0;
    int last = PQS_N_BUCKETS - 1;
    for (int b = 0; b < PQS_N_BUCKETS; ++b) {
        acc += mass[b];
        if (acc >= need) {
            last = b;
            break;
        }
    }
    if (last == PQS_N_BUCKETS - 1) {
        return m;
    }
    int64_t s = 0;
    for (int64_t i = 0; i < m; ++i) {
        if (pqs_bucket(c[i].logit, lmax) <= last) {
            const struct pqs_cand t = c[s]; c[s] = c[i]; c[i] = t;
            s++;
        }
    }
    return s;
}

// One row; returns the chosen id, or -1 when every logit is NaN.
static int32_t pqs_row(const float * logits, int64_t n_vocab, const float * prm,
                       const int32_t * hist, int64_t n_hist, struct pqs_cand * c, double * p) {
    const float temp    = prm[GGML_PYQWEN_SAMPLE_TEMPERATURE];
    const float top_k   = prm[GGML_PYQWEN_SAMPLE_TOP_K];
    const float top_p   = prm[GGML_PYQWEN_SAMPLE_TOP_P];
    const float min_p   = prm[GGML_PYQWEN_SAMPLE_MIN_P];
    const float penalty = prm[GGML_PYQWEN_SAMPLE_REPEAT_PENALTY];
    const float uniform = prm[GGML_PYQWEN_SAMPLE_UNIFORM];

    for (int64_t i = 0; i < n_vocab; ++i) {
        c[i].logit = logits[i];
        c[i].id    = (int32_t) i;
    }

    if (penalty != 1.0f) {
        // each distinct id once: a penalised entry is marked by a negative id until the end
        for (int64_t j = 0; j < n_hist; ++j) {
            const int32_t t = hist[j];
            if (t < 0 || t >= n_vocab || c[t].id < 0) {
                continue;
            }
            c[t].logit = c[t].logit > 0.0f ? c[t].logit / penalty : c[t].logit * penalty;
            c[t].id    = -1 - t;
        }
        for (int64_t j = 0; j < n_hist; ++j) {
            const int32_t t = hist[j];
            if (t >= 0 && t < n_vocab) {
                c[t].id = t;
            }
        }
    }

    // argmax over the non-NaN logits (lowest id on ties); NaN becomes -inf so it ranks last
    int64_t best = -1;
    for (int64_t i = 0; i < n_vocab; ++i) {
        if (isnan(c[i].logit)) {
            c[i].logit = -INFINITY;
        } else if (best < 0 || c[i].logit > c[best].logit) {
            best = i;
        }
    }
    if (best < 0) {
        return -1;
    }
    if (!(temp > 0.0f) || !isfinite(c[best].logit)) {
        return (int32_t) best;
    }
    const double lmax = c[best].logit;

    int64_t k = n_vocab;
    if (top_k >= 1.0f && top_k < (float) n_vocab) {
        k = (int64_t) top_k;
        pqs_select(c, n_vocab, k);
    }

    // untempered probabilities relative to the best, p[i] belonging to c[i]
    double sum = 0.0;
    for (int64_t i = 0; i < k; ++i) {
        p[i] = exp((double) c[i].logit - lmax);
        sum += p[i];
    }

    // min-p keeps a prefix of the ranking (at least the best): move it to the front
    int64_t m = k;
    if (min_p > 0.0f) {
        const double floor_p = (double) min_p;
        m = 0;
        for (int64_t i = 0; i < k; ++i) {
            if (c[i].id == best || p[i] >= floor_p) {
                const struct pqs_cand t = c[m]; c[m] = c[i]; c[i] = t;
                const double          q = p[m]; p[m] = p[i]; p[i] = q;
                m++;
            }
        }
    }

    // sort the part of the ranking that top-p can cut (all of it when top-p is off)
    int64_t s = m;
    if (top_p < 1.0f && m > PQS_DIRECT_SORT) {
        s = pqs_top_p_prefix(c, p, m, lmax, sum, top_p);
    }
    int64_t n = m;
    for (;;) {
        qsort(c, (size_t) s, sizeof(*c), pqs_cmp);
        for (int64_t i = 0; i < s; ++i) {
            p[i] = exp((double) c[i].logit - lmax);
        }
        if (!(top_p < 1.0f)) {
            break;
        }
        double acc = 0.0;
        int64_t cut = -1;
        for (int64_t i = 0; i < s; ++i) {
            acc += p[i] / sum;
            if (acc >= (double) top_p) {
                cut = i + 1;
                break;
            }
        }
        if (cut > 0 || s == m) {
            n = cut > 0 ? cut : m;
            break;
        }
        s = m;  // the margin did not hold (should not happen): sort everything
    }

    double tsum = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        p[i] = exp(((double) c[i].logit - lmax) / (double) temp);
        tsum += p[i];
    }
    const double target = (double) uniform * tsum;
    double acc = 0.0;
    int64_t pick = -1;
    for (int64_t i = 0; i < n; ++i) {
        acc += p[i];
        if (target < acc) {
            pick = i;
            break;
        }
    }
    if (pick < 0) {
        // uniform outside [0, 1): the last candidate that can be drawn at all
        pick = n - 1;
        while (pick > 0 && p[pick] == 0.0) {
            pick--;
        }
    }
    return c[pick].id;
}

static size_t pqs_row_bytes(int64_t n_vocab) {
    const size_t bytes = (size_t) n_vocab * (sizeof(struct pqs_cand) + sizeof(double));
    return (bytes + 63) & ~(size_t) 63;
}

int ggml_pyqwen_sample_n_tasks(const struct ggml_tensor * dst, int n_threads) {
    const int64_t n_rows = dst->src[0]->ne[1];
    return (int) (n_rows < n_threads ? (n_rows > 0 ? n_rows : 1) : n_threads);
}

size_t ggml_pyqwen_sample_work_size(const struct ggml_tensor * dst, int n_tasks) {
    return pqs_row_bytes(dst->src[0]->ne[0]) * (size_t) n_tasks;
}

void ggml_compute_forward_pyqwen_sample(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const struct ggml_tensor * logits  = dst->src[0];
    const struct ggml_tensor * prm     = dst->src[1];
    const struct ggml_tensor * history = dst->src[2];

    const int64_t n_vocab = logits->ne[0];
    const int64_t n_rows  = logits->ne[1];
    const int64_t n_hist  = history->ne[0];

    if (params->ith >= n_rows) {
        return;
    }
    const size_t row_bytes = pqs_row_bytes(n_vocab);
    GGML_ASSERT(params->wsize >= row_bytes * (size_t) (params->ith + 1));
    struct pqs_cand * c = (struct pqs_cand *) ((char *) params->wdata + row_bytes * (size_t) params->ith);
    double          * p = (double *) (c + n_vocab);

    for (int64_t r = params->ith; r < n_rows; r += params->nth) {
        ((int32_t *) dst->data)[r] = pqs_row(
            (const float   *) ((const char *) logits->data  + r * logits->nb[1]),  n_vocab,
            (const float   *) ((const char *) prm->data     + r * prm->nb[1]),
            (const int32_t *) ((const char *) history->data + r * history->nb[1]), n_hist,
            c, p);
    }
}
