/* Token sampling over one row of logits on the host. The sampler itself is the patched ggml op
 * GGML_OP_PYQWEN_SAMPLE (ggml-patches/, include/ggml-pyqwen.h): this builds a one-node graph
 * around it on the CPU backend, so the C API and the in-graph sampler are the same code. */
#include "pq-internal.h"

#include "ggml-pyqwen.h"

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

int pq_sample_logits(const float * logits, int32_t n_vocab, const pq_sampling * s,
                     const int32_t * history, int32_t n_history, float uniform, int32_t * out_token) {
    if (!logits || !s || !out_token) return pq_fail("pq_sample_logits: NULL argument");
    if (n_vocab <= 0) return pq_fail("empty logits");
    if (n_history < 0 || (n_history > 0 && !history)) return pq_fail("pq_sample_logits: bad history");

    /* the penalty looks at the last repeat_last_n tokens (all when <= 0); the op takes exactly
     * that window, with one empty slot (-1) rather than a zero-sized tensor when there is none */
    int32_t window = 0;
    if (s->repeat_penalty != 1.0f && n_history > 0)
        window = s->repeat_last_n > 0 && s->repeat_last_n < n_history ? s->repeat_last_n : n_history;
    const int32_t empty_slot = -1;
    float params[GGML_PYQWEN_SAMPLE_N_PARAMS];
    pq_sampler_params(s, uniform, params);

    struct ggml_init_params ip = {
        .mem_size   = 8 * ggml_tensor_overhead() + ggml_graph_overhead_custom(8, false),
        .mem_buffer = NULL,
        .no_alloc   = true,
    };
    struct ggml_context * ctx = ggml_init(ip);
    if (!ctx) return pq_fail("out of memory");
    struct ggml_tensor * t_logits  = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_vocab, 1);
    struct ggml_tensor * t_params  = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, GGML_PYQWEN_SAMPLE_N_PARAMS, 1);
    struct ggml_tensor * t_history = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, window > 0 ? window : 1, 1);
    struct ggml_tensor * t_out     = ggml_pyqwen_sample(ctx, t_logits, t_params, t_history);
    struct ggml_cgraph * gf = ggml_new_graph_custom(ctx, 8, false);
    ggml_build_forward_expand(gf, t_out);

    int rc = -1;
    ggml_backend_buffer_t buf = NULL;
    ggml_backend_t cpu = ggml_backend_cpu_init();
    if (!cpu) { pq_fail("could not start the CPU backend"); goto done; }
    ggml_backend_cpu_set_n_threads(cpu, 1);   /* one row: the op would use one thread anyway */
    buf = ggml_backend_alloc_ctx_tensors(ctx, cpu);
    if (!buf) { pq_fail("out of memory"); goto done; }

    ggml_backend_tensor_set(t_logits, logits, 0, ggml_nbytes(t_logits));
    ggml_backend_tensor_set(t_params, params, 0, sizeof(params));
    if (window > 0) ggml_backend_tensor_set(t_history, history + (n_history - window), 0, sizeof(int32_t) * (size_t) window);
    else            ggml_backend_tensor_set(t_history, &empty_slot, 0, sizeof(empty_slot));

    if (ggml_backend_graph_compute(cpu, gf) != GGML_STATUS_SUCCESS) { pq_fail("sampling graph failed"); goto done; }
    int32_t token = -1;
    ggml_backend_tensor_get(t_out, &token, 0, sizeof(token));
    if (token < 0) { pq_fail("cannot sample: every logit is NaN"); goto done; }
    *out_token = token;
    rc = 0;
done:
    if (buf) ggml_backend_buffer_free(buf);
    if (cpu) ggml_backend_free(cpu);
    ggml_free(ctx);
    return rc;
}
