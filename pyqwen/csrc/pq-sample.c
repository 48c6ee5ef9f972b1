/* Token sampling over one row of logits, in llama.cpp's order: repetition penalty, top-k,
 * top-p, min-p (on the untempered distribution), temperature, then one draw. */
#include "pq-internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct cand { float logit; int32_t id; };

static int by_logit_desc(const void * a, const void * b) {
    const float x = ((const struct cand *) a)->logit, y = ((const struct cand *) b)->logit;
    if (x != y) return x < y ? 1 : -1;
    return ((const struct cand *) a)->id - ((const struct cand *) b)->id;  /* stable ties: lower id first */
}

/* Moves the k largest candidates to the front, sorted; O(n log k) via a bounded selection. */
static void top_k_sorted(struct cand * c, int32_t n, int32_t k) {
    if (k >= n) { qsort(c, n, sizeof(*c), by_logit_desc); return; }
    /* quickselect on the k-th position, then sort the head */
    int32_t lo = 0, hi = n - 1;
    while (lo < hi) {
        const struct cand pivot = c[(lo + hi) / 2];
        int32_t i = lo, j = hi;
        while (i <= j) {
            while (by_logit_desc(&c[i], &pivot) < 0) i++;
            while (by_logit_desc(&c[j], &pivot) > 0) j--;
            if (i <= j) { struct cand t = c[i]; c[i] = c[j]; c[j] = t; i++; j--; }
        }
        if (k - 1 <= j) hi = j; else if (k - 1 >= i) lo = i; else break;
    }
    qsort(c, k, sizeof(*c), by_logit_desc);
}

int pq_sample_logits(const float * logits, int32_t n_vocab, const pq_sampling * s,
                     const int32_t * history, int32_t n_history, float uniform, int32_t * out_token) {
    if (n_vocab <= 0) return pq_fail("empty logits");
    struct cand * c = malloc(sizeof(*c) * (size_t) n_vocab);
    if (!c) return pq_fail("out of memory");
    for (int32_t i = 0; i < n_vocab; ++i) { c[i].logit = logits[i]; c[i].id = i; }

    if (s->repeat_penalty != 1.0f && n_history > 0) {
        const int32_t window = s->repeat_last_n > 0 && s->repeat_last_n < n_history ? s->repeat_last_n : n_history;
        unsigned char * seen = calloc((size_t) n_vocab, 1);
        if (!seen) { free(c); return pq_fail("out of memory"); }
        for (int32_t i = n_history - window; i < n_history; ++i) {
            const int32_t t = history[i];
            if (t < 0 || t >= n_vocab || seen[t]) continue;
            seen[t] = 1;
            c[t].logit = c[t].logit > 0.0f ? c[t].logit / s->repeat_penalty : c[t].logit * s->repeat_penalty;
        }
        free(seen);
    }

    int32_t n = n_vocab;
    const int32_t k = s->top_k > 0 && s->top_k < n_vocab ? s->top_k : n_vocab;
    if (s->temperature <= 0.0f) {
        top_k_sorted(c, n, 1);
        *out_token = c[0].id;
        free(c);
        return 0;
    }
    top_k_sorted(c, n, k);
    n = k;

    /* probabilities of the untempered distribution over the kept candidates */
    double * p = malloc(sizeof(double) * (size_t) n);
    if (!p) { free(c); return pq_fail("out of memory"); }
    double sum = 0.0;
    for (int32_t i = 0; i < n; ++i) { p[i] = exp((double) c[i].logit - c[0].logit); sum += p[i]; }
    if (s->top_p < 1.0f) {
        double acc = 0.0;
        for (int32_t i = 0; i < n; ++i) {
            acc += p[i] / sum;
            if (acc >= s->top_p) { n = i + 1; break; }
        }
    }
    if (s->min_p > 0.0f) {
        const double floor_p = s->min_p * p[0];   /* p[0] is the largest */
        int32_t keep = 1;
        while (keep < n && p[keep] >= floor_p) keep++;
        n = keep;
    }

    sum = 0.0;
    for (int32_t i = 0; i < n; ++i) { p[i] = exp(((double) c[i].logit - c[0].logit) / s->temperature); sum += p[i]; }
    double target = (double) uniform * sum, acc = 0.0;
    int32_t pick = n - 1;
    for (int32_t i = 0; i < n; ++i) {
        acc += p[i];
        if (target < acc) { pick = i; break; }
    }
    *out_token = c[pick].id;
    free(p);
    free(c);
    return 0;
}
