/* Token sampling over one row of logits on the host. The sampler itself is the patched ggml op
 * GGML_OP_PYQWEN_SAMPLE (ggml-patches/, include/ggml-pyqwen.h): this builds a one-node graph
 * around it on the CPU backend (or the first CUDA device's, to check that kernel against the
 * CPU's), so the C API and the in-graph sampler are the same code. pq_run_on_cpu is that runner,
 * shared with the other host entries that run one op. */
#include "pq-internal.h"

#include "ggml-pyqwen.h"
#ifdef PYQWEN_WITH_CUDA
#include "ggml-cuda.h"
#endif

#include <string.h>

void pq_sampler_params(const pq_sampling * s, float uniform, float * params) {
    memset(params, 0, sizeof(float) * GGML_PYQWEN_SAMPLE_N_PARAMS);
    params[GGML_PYQWEN_SAMPLE_TEMPERATURE]    = s->temperature;
    params[GGML_PYQWEN_SAMPLE_TOP_K]          = (float) s->top_k;
    params[GGML_PYQWEN_SAMPLE_TOP_P]          = s->top_p;
    params[GGML_PYQWEN_SAMPLE_MIN_P]          = s->min_p;
    params[GGML_PYQWEN_SAMPLE_REPEAT_PENALTY] = s->repeat_penalty;
    params[GGML_PYQWEN_SAMPLE_UNIFORM]        = uniform;
}

struct ggml_context * pq_small_ctx(void) {
    struct ggml_init_params ip = { .mem_size = 16 * ggml_tensor_overhead() + ggml_graph_overhead_custom(16, false),
                                   .mem_buffer = NULL, .no_alloc = true };
    return ggml_init(ip);
}

/* The graph of `out` on `backend`: inputs in[i] set from data[i], the result read into `result` and,
 * where back[i] is set, in[i] read back (an op may update an input in place). */
static int run_on(ggml_backend_t backend, struct ggml_context * ctx, struct ggml_tensor * out, struct ggml_tensor ** in,
                  const void ** data, int n_in, void * result, void * const * back) {
    struct ggml_cgraph * gf = ggml_new_graph_custom(ctx, 16, false);
    ggml_build_forward_expand(gf, out);
    if (!ggml_backend_supports_op(backend, out)) {
        return pq_fail("%s cannot compute %s on these shapes", ggml_backend_name(backend), ggml_op_desc(out));
    }
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, backend);
    if (!buf) return pq_fail("out of memory");
    int rc = -1;
    for (int i = 0; i < n_in; ++i) ggml_backend_tensor_set(in[i], data[i], 0, ggml_nbytes(in[i]));
    if (ggml_backend_graph_compute(backend, gf) != GGML_STATUS_SUCCESS) {
        pq_fail("%s failed to compute %s", ggml_backend_name(backend), ggml_op_desc(out));
    } else {
        ggml_backend_tensor_get(out, result, 0, ggml_nbytes(out));
        for (int i = 0; back && i < n_in; ++i) {
            if (back[i]) ggml_backend_tensor_get(in[i], back[i], 0, ggml_nbytes(in[i]));
        }
        rc = 0;
    }
    ggml_backend_buffer_free(buf);
    return rc;
}

int pq_run_on_cpu(struct ggml_context * ctx, struct ggml_tensor * out, struct ggml_tensor ** in, const void ** data,
                  int n_in, int n_threads, void * result, void * const * back) {
    ggml_backend_t cpu = ggml_backend_cpu_init();
    if (!cpu) return pq_fail("could not start the CPU backend");
    ggml_backend_cpu_set_n_threads(cpu, n_threads);
    const int rc = run_on(cpu, ctx, out, in, data, n_in, result, back);
    ggml_backend_free(cpu);
    return rc;
}

/* The first CUDA device's backend, or NULL with the reason as the error. */
static ggml_backend_t first_cuda_backend(const char * fn) {
#ifdef PYQWEN_WITH_CUDA
    ggml_backend_t cuda = ggml_backend_cuda_get_device_count() > 0 ? ggml_backend_cuda_init(0) : NULL;
    if (!cuda) pq_fail("%s: no CUDA device answers", fn);
    return cuda;
#else
    pq_fail("%s: this pyqwen was built without CUDA (pip install . -C cmake.define.PYQWEN_CUDA=ON)", fn);
    return NULL;
#endif
}

static int sample_logits(bool gpu, const char * fn, const float * logits, int32_t n_vocab, const pq_sampling * s,
                         const int32_t * history, int32_t n_history, float uniform, int32_t * out_token) {
    if (!logits || !s || !out_token) return pq_fail("%s: NULL argument", fn);
    if (n_vocab <= 0) return pq_fail("empty logits");
    if (n_history < 0 || (n_history > 0 && !history)) return pq_fail("%s: bad history", fn);

    /* the penalty looks at the last repeat_last_n tokens (all when <= 0); the op takes exactly
     * that window, with one empty slot (-1) rather than a zero-sized tensor when there is none */
    int32_t window = 0;
    if (s->repeat_penalty != 1.0f && n_history > 0)
        window = s->repeat_last_n > 0 && s->repeat_last_n < n_history ? s->repeat_last_n : n_history;
    const int32_t empty_slot = -1;
    float params[GGML_PYQWEN_SAMPLE_N_PARAMS];
    pq_sampler_params(s, uniform, params);

    ggml_backend_t cuda = NULL;
    if (gpu && !(cuda = first_cuda_backend(fn))) return -1;
    struct ggml_context * ctx = pq_small_ctx();
    if (!ctx) {
        if (cuda) ggml_backend_free(cuda);
        return pq_fail("out of memory");
    }
    struct ggml_tensor * in[3] = {
        ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_vocab, 1),
        ggml_new_tensor_2d(ctx, GGML_TYPE_F32, GGML_PYQWEN_SAMPLE_N_PARAMS, 1),
        ggml_new_tensor_2d(ctx, GGML_TYPE_I32, window > 0 ? window : 1, 1),
    };
    const void * data[3] = { logits, params, window > 0 ? (const void *) (history + (n_history - window)) : &empty_slot };
    struct ggml_tensor * out = ggml_pyqwen_sample(ctx, in[0], in[1], in[2]);
    int32_t token = -1;
    /* one row: the CPU op would use one thread anyway */
    int rc = cuda ? run_on(cuda, ctx, out, in, data, 3, &token, NULL) : pq_run_on_cpu(ctx, out, in, data, 3, 1, &token, NULL);
    ggml_free(ctx);
    if (cuda) ggml_backend_free(cuda);
    if (rc == 0 && token < 0) rc = pq_fail("cannot sample: every logit is NaN");
    if (rc == 0) *out_token = token;
    return rc;
}

int pq_sample_logits(const float * logits, int32_t n_vocab, const pq_sampling * s,
                     const int32_t * history, int32_t n_history, float uniform, int32_t * out_token) {
    return sample_logits(false, "pq_sample_logits", logits, n_vocab, s, history, n_history, uniform, out_token);
}

int pq_sample_logits_gpu(const float * logits, int32_t n_vocab, const pq_sampling * s,
                         const int32_t * history, int32_t n_history, float uniform, int32_t * out_token) {
    return sample_logits(true, "pq_sample_logits_gpu", logits, n_vocab, s, history, n_history, uniform, out_token);
}
