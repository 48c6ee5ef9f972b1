/* Inference state (KV cache, conv and recurrent states), the current graph, evaluation. */
#include "pq-internal.h"

#ifdef PYQWEN_WITH_CUDA
#include "ggml-cuda.h"
#endif

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static bool cache_type_ok(int32_t t) {
    return t == PQ_CACHE_F32 || t == PQ_CACHE_F16 || t == PQ_CACHE_Q8_0 || t == PQ_CACHE_Q4_0;
}

/* Cache cells attended when the context holds n_end tokens: whole blocks of PQ_KV_PAD cells, as
 * ggml's flash attention takes its fast paths (GQA packing, vector kernel) only on spans that
 * are a multiple of 256. The cache itself is padded to whole blocks; cells past n_ctx are never
 * written and always masked. */
static int32_t kv_span(int32_t n_end) {
    return (n_end + PQ_KV_PAD - 1) / PQ_KV_PAD * PQ_KV_PAD;
}

/* One row of an attention mask: cells [0, seen) visible (0), the rest of the n masked (-inf). */
static void mask_row(uint16_t * row, int64_t seen, int64_t n) {
    const ggml_fp16_t zero = ggml_fp32_to_fp16(0.0f), ninf = ggml_fp32_to_fp16(-INFINITY);
    for (int64_t j = 0; j < seen; ++j) row[j] = zero;
    for (int64_t j = seen; j < n; ++j) row[j] = ninf;
}

/* Host memory the system can give this process now: Linux's MemAvailable, elsewhere the physical memory. A
 * larger allocation can succeed lazily under overcommit and get the process killed when the reset clears it. */
static int64_t host_available_bytes(void) {
    long long kib = -1;
    FILE * f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        while (kib < 0 && fgets(line, sizeof(line), f)) {
            if (sscanf(line, "MemAvailable: %lld kB", &kib) != 1) kib = -1;
        }
        fclose(f);
    }
    return kib >= 0 ? (int64_t) kib * 1024 : (int64_t) sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGESIZE);
}

static int64_t ctx_bytes(struct ggml_context * c) {
    int64_t n = 0;
    for (struct ggml_tensor * t = c ? ggml_get_first_tensor(c) : NULL; t; t = ggml_get_next_tensor(c, t)) n += ggml_nbytes(t);
    return n;
}

static int alloc_state(struct pq_ctx * ctx) {
    const struct pq_model * m = ctx->model;
    const struct pq_hparams * hp = &m->hp;
    const int64_t n_ctx = ctx->params.n_ctx, n_cells = kv_span(ctx->params.n_ctx);
    struct ggml_init_params ip = { .mem_size = (size_t) (4 * hp->n_layer + 1) * ggml_tensor_overhead(), .mem_buffer = NULL, .no_alloc = true };
    ctx->ctx_state_cpu = ggml_init(ip);
    if (m->backend_gpu) ctx->ctx_state_gpu = ggml_init(ip);
    bool attention_on_gpu = false;
    for (int il = 0; il < hp->n_layer; ++il) {
        struct ggml_context * c = m->layers[il].on_gpu ? ctx->ctx_state_gpu : ctx->ctx_state_cpu;
        if (pq_is_recurrent(hp, il)) {
            ctx->conv_state[il] = ggml_new_tensor_2d(c, GGML_TYPE_F32, hp->conv_kernel - 1, pq_conv_channels(hp));
            ctx->ssm_state[il] = ggml_new_tensor_4d(c, GGML_TYPE_F32, hp->ssm_d_state, hp->ssm_d_state, hp->ssm_n_v_heads, 1);
        } else {
            const int64_t row = (int64_t) hp->head_dim * hp->n_head_kv;
            ctx->k_cache[il] = ggml_new_tensor_2d(c, (enum ggml_type) ctx->params.type_k, row, n_cells);
            ctx->v_cache[il] = ggml_new_tensor_2d(c, (enum ggml_type) ctx->params.type_v, row, n_cells);
            attention_on_gpu = attention_on_gpu || m->layers[il].on_gpu;
        }
    }
    ctx->kv_seen = ggml_new_tensor_1d(attention_on_gpu ? ctx->ctx_state_gpu : ctx->ctx_state_cpu, GGML_TYPE_F16, n_cells);
    /* the host's share: its layers' cache and states, and the attention masks of a full batch */
    const int64_t host_need = ctx_bytes(ctx->ctx_state_cpu) + (int64_t) sizeof(uint16_t) * n_cells * ctx->params.n_batch;
    const int64_t host_avail = host_available_bytes();
    if (host_avail > 0 && host_need > host_avail) {
        const double gib = 1024.0 * 1024.0 * 1024.0;
        return pq_fail("n_ctx=%lld needs %.1f GiB of host memory for the KV cache, states and masks, and %.1f GiB are "
                       "available; use a smaller n_ctx%s", (long long) n_ctx, host_need / gib, host_avail / gib,
                       m->n_gpu_layers < hp->n_layer && m->backend_gpu ? " or put more layers on the GPU (n_gpu_layers)" : "");
    }
    ctx->buf_state_cpu = ggml_backend_alloc_ctx_tensors_from_buft(ctx->ctx_state_cpu, ggml_backend_get_default_buffer_type(m->backend_cpu));
    if (ggml_get_first_tensor(ctx->ctx_state_cpu) && !ctx->buf_state_cpu) {
        return pq_fail("out of host memory for the KV cache and states (n_ctx=%lld); use a smaller n_ctx", (long long) n_ctx);
    }
    if (ctx->ctx_state_gpu && ggml_get_first_tensor(ctx->ctx_state_gpu)) {
        ctx->buf_state_gpu = ggml_backend_alloc_ctx_tensors_from_buft(ctx->ctx_state_gpu, ggml_backend_get_default_buffer_type(m->backend_gpu));
        if (!ctx->buf_state_gpu) {
            return pq_fail("out of GPU memory for the KV cache and states (%.1f GiB at n_ctx=%lld); use a smaller n_ctx",
                           ctx_bytes(ctx->ctx_state_gpu) / (1024.0 * 1024.0 * 1024.0), (long long) n_ctx);
        }
    }
    return 0;
}

void pq_ctx_reset(pq_ctx * ctx) {
    /* Recurrent states must start at zero; the KV cache is masked, but clear it too so a
     * reset context is bit-identical to a new one. */
    if (ctx->buf_state_cpu) ggml_backend_buffer_clear(ctx->buf_state_cpu, 0);
    if (ctx->buf_state_gpu) ggml_backend_buffer_clear(ctx->buf_state_gpu, 0);
    mask_row(ctx->mask_buf, 0, ggml_nelements(ctx->kv_seen));  /* no cell seen yet */
    ggml_backend_tensor_set(ctx->kv_seen, ctx->mask_buf, 0, ggml_nbytes(ctx->kv_seen));
    ctx->n_past = 0;
}

static void free_graph(struct pq_graph * g) {
    if (g->ctx) ggml_free(g->ctx);
    memset(g, 0, sizeof(*g));
}

/* With every layer on the GPU, a short pass's inputs are read there: pinned to the GPU, they are
 * written by set_input's queued copies, where the scheduler would keep them in host memory and copy
 * each to the GPU with a blocking copy at every pass. The sampler's follow the output layer. Long
 * passes keep the scheduler's copies: a pinned input holds its memory for the whole graph, and the
 * prefill mask (32 MiB at n_ctx 32768) would then no longer share it with the logits. */
static void pin_inputs(struct pq_ctx * ctx, const struct pq_graph * g) {
    const struct pq_model * m = ctx->model;
    if (!m->backend_gpu || m->n_gpu_layers < m->hp.n_layer || g->n_tokens > PQ_SHORT_PASS_TOKENS) return;
    struct ggml_tensor * layer_inputs[] = { g->inp_embd, g->inp_pos, g->inp_kv_idx, g->inp_mask };
    for (size_t i = 0; i < sizeof(layer_inputs) / sizeof(layer_inputs[0]); ++i) {
        if (layer_inputs[i]) ggml_backend_sched_set_tensor_backend(ctx->sched, layer_inputs[i], m->backend_gpu);
    }
    if (m->output_on_gpu && g->inp_sampler) {
        ggml_backend_sched_set_tensor_backend(ctx->sched, g->inp_sampler, m->backend_gpu);
        ggml_backend_sched_set_tensor_backend(ctx->sched, g->inp_history, m->backend_gpu);
    }
}

/* The graph for this shape, allocated and ready to run: the current one when the shape is the
 * same, else a new one (see struct pq_ctx). */
static struct pq_graph * get_graph(struct pq_ctx * ctx, int32_t n_tokens, int32_t n_kv, int32_t out_mode) {
    struct pq_graph * g = &ctx->graph;
    if (g->ctx && g->n_tokens == n_tokens && g->n_kv == n_kv && g->out_mode == out_mode) return g;
    free_graph(g);
    g->n_tokens = n_tokens;
    g->n_kv = n_kv;
    g->out_mode = out_mode;
    g->gf = pq_build_graph(ctx, g);
    ggml_backend_sched_reset(ctx->sched);
    if (g->gf) pin_inputs(ctx, g);
    if (!g->gf || !ggml_backend_sched_alloc_graph(ctx->sched, g->gf)) {
        free_graph(g);
        pq_fail("could not build and allocate the compute graph");
        return NULL;
    }
    return g;
}

int pq_ctx_new(pq_model * model, const pq_ctx_params * params, pq_ctx ** out) {
    *out = NULL;
    if (params->n_ctx <= 0) return pq_fail("n_ctx must be positive, got %d", params->n_ctx);
    if (params->n_batch <= 0) return pq_fail("n_batch must be positive, got %d", params->n_batch);
    if (!cache_type_ok(params->type_k) || !cache_type_ok(params->type_v)) return pq_fail("unsupported KV cache type");
    if (params->type_k != PQ_CACHE_F32 && params->type_k != PQ_CACHE_F16 && model->hp.head_dim % 32 != 0) {
        return pq_fail("quantized KV cache needs a head dim multiple of 32");
    }
    struct pq_ctx * ctx = calloc(1, sizeof(*ctx));
    if (!ctx) return pq_fail("out of memory");
    ctx->model = model;
    ctx->params = *params;
    const int32_t nb = params->n_batch < params->n_ctx ? params->n_batch : params->n_ctx;
    ctx->params.n_batch = nb;
    if (alloc_state(ctx)) goto fail;
    ctx->mask_buf = malloc(sizeof(uint16_t) * (size_t) kv_span(params->n_ctx) * nb);
    ctx->seen_buf = calloc((size_t) nb, sizeof(uint16_t));
    ctx->embd_buf = malloc(sizeof(float) * (size_t) model->hp.n_embd * PQ_SHORT_PASS_TOKENS);
    ctx->pos_buf = malloc(sizeof(int32_t) * nb);
    ctx->idx_buf = malloc(sizeof(int64_t) * nb);
    if (!ctx->mask_buf || !ctx->seen_buf || !ctx->embd_buf || !ctx->pos_buf || !ctx->idx_buf) {
        pq_fail("out of host memory for the context's buffers (n_ctx=%d); use a smaller n_ctx", params->n_ctx);
        goto fail;
    }

    ggml_backend_t backends[2];
    int n_backends = 0;
    if (model->backend_gpu) backends[n_backends++] = model->backend_gpu;
    backends[n_backends++] = model->backend_cpu;
    ctx->sched = ggml_backend_sched_new(backends, NULL, n_backends, 16384, false, model->backend_gpu != NULL);
    if (!ctx->sched) { pq_fail("could not create the scheduler"); goto fail; }

    /* Reserve compute buffers for the largest pass up front, so memory use is known now. */
    struct pq_graph * g = &ctx->graph;
    g->n_tokens = nb;
    g->n_kv = kv_span(params->n_ctx);
    g->out_mode = PQ_OUT_ALL;
    g->gf = pq_build_graph(ctx, g);
    if (g->gf) pin_inputs(ctx, g);
    const bool reserved = g->gf && ggml_backend_sched_reserve(ctx->sched, g->gf);
    free_graph(g);  /* reserving split it: it cannot be allocated again */
    if (!reserved) { pq_fail("could not reserve the compute buffers (out of memory?); use a smaller n_ctx or n_batch"); goto fail; }
#ifdef PYQWEN_WITH_CUDA
    if (model->decode_pipeline) {
        ggml_backend_dev_t dev = ggml_backend_get_device(model->backend_gpu);
        ctx->token_slots_buf = ggml_backend_buft_alloc_buffer(ggml_backend_cuda_host_buffer_type(), 2 * sizeof(int32_t));
        ctx->pass_done[0] = ggml_backend_event_new(dev);
        ctx->pass_done[1] = ggml_backend_event_new(dev);
        if (!ctx->token_slots_buf || !ctx->pass_done[0] || !ctx->pass_done[1]) { pq_fail("could not create the decode pipeline's events"); goto fail; }
        ctx->token_slots = ggml_backend_buffer_get_base(ctx->token_slots_buf);
    }
#endif
    pq_ctx_reset(ctx);
    *out = ctx;
    return 0;
fail:
    pq_ctx_free(ctx);
    return -1;
}

void pq_ctx_free(pq_ctx * ctx) {
    if (!ctx) return;
    free_graph(&ctx->graph);
    if (ctx->sched) ggml_backend_sched_free(ctx->sched);
    for (int i = 0; i < 2; ++i) {
        if (ctx->pass_done[i]) ggml_backend_event_free(ctx->pass_done[i]);
    }
    if (ctx->token_slots_buf) ggml_backend_buffer_free(ctx->token_slots_buf);
    if (ctx->buf_state_cpu) ggml_backend_buffer_free(ctx->buf_state_cpu);
    if (ctx->buf_state_gpu) ggml_backend_buffer_free(ctx->buf_state_gpu);
    if (ctx->ctx_state_cpu) ggml_free(ctx->ctx_state_cpu);
    if (ctx->ctx_state_gpu) ggml_free(ctx->ctx_state_gpu);
    free(ctx->mask_buf);
    free(ctx->seen_buf);
    free(ctx->embd_buf);
    free(ctx->pos_buf);
    free(ctx->idx_buf);
    free(ctx);
}

int32_t pq_ctx_n_past(const pq_ctx * ctx) { return ctx->n_past; }

void pq_ctx_get_timings(const pq_ctx * ctx, pq_ctx_timings * out) { *out = ctx->timings; }

int64_t pq_ctx_memory_bytes(const pq_ctx * ctx) {
    int64_t total = 0;
    if (ctx->buf_state_cpu) total += ggml_backend_buffer_get_size(ctx->buf_state_cpu);
    if (ctx->buf_state_gpu) total += ggml_backend_buffer_get_size(ctx->buf_state_gpu);
    for (int i = 0; i < ggml_backend_sched_get_n_backends(ctx->sched); ++i) {
        total += ggml_backend_sched_get_buffer_size(ctx->sched, ggml_backend_sched_get_backend(ctx->sched, i));
    }
    return total;
}

static bool on_gpu(const struct pq_ctx * ctx, const struct ggml_tensor * t) {
    const ggml_backend_buffer_t buf = t->view_src ? t->view_src->buffer : t->buffer;
    return ctx->model->backend_gpu && !ggml_backend_buffer_is_host(buf);
}

/* A pass's inputs go to the GPU as copies queued on its stream ahead of the graph, not as blocking
 * copies, each a round trip to the device while it idles between passes. CUDA stages pageable host
 * data when the copy is queued, so the host buffers are free again at once. */
static void set_input(const struct pq_ctx * ctx, struct ggml_tensor * t, const void * data, size_t offset, size_t size) {
    if (on_gpu(ctx, t)) {
        ggml_backend_tensor_set_async(ctx->model->backend_gpu, t, data, offset, size);
    } else {
        ggml_backend_tensor_set(t, data, offset, size);
    }
}

/* The embedding rows of tokens into embd_buf, as the graph's lookup would gather them. */
static void embed_rows(struct pq_ctx * ctx, const int32_t * tokens, int32_t n) {
    const struct ggml_tensor * e = ctx->model->tok_embd;   /* always in host memory (pq-model.c) */
    const int64_t n_embd = e->ne[0];
    const ggml_to_float_t to_float = ggml_get_type_traits(e->type)->to_float;
    for (int32_t i = 0; i < n; ++i) {
        const char * row = (const char *) e->data + (size_t) tokens[i] * e->nb[1];
        float * dst = ctx->embd_buf + (size_t) i * n_embd;
        if (e->type == GGML_TYPE_F32) {
            memcpy(dst, row, sizeof(float) * (size_t) n_embd);
        } else {
            to_float(row, dst, n_embd);
        }
    }
}

/* A pass's inputs but its tokens: positions, cache cells, kv_seen, mask, the sampler's settings. */
static void set_pass_inputs(struct pq_ctx * ctx, const struct pq_graph * g, int32_t n) {
    const int32_t n_past = ctx->n_past, n_kv = g->n_kv;
    /* the cells this pass writes become visible in kv_seen (0 is fp16 zero's bit pattern) */
    set_input(ctx, ctx->kv_seen, ctx->seen_buf, sizeof(ggml_fp16_t) * (size_t) n_past, sizeof(ggml_fp16_t) * (size_t) n);
    for (int32_t i = 0; i < n; ++i) {
        ctx->pos_buf[i] = n_past + i;
        ctx->idx_buf[i] = n_past + i;
        /* causal: row i sees cells 0 ..= n_past + i */
        if (g->inp_mask) mask_row(ctx->mask_buf + (size_t) i * n_kv, n_past + i + 1, n_kv);
    }
    set_input(ctx, g->inp_pos, ctx->pos_buf, 0, sizeof(int32_t) * n);
    set_input(ctx, g->inp_kv_idx, ctx->idx_buf, 0, sizeof(int64_t) * n);
    if (g->inp_mask) set_input(ctx, g->inp_mask, ctx->mask_buf, 0, sizeof(uint16_t) * (size_t) n * n_kv);
    if (g->out_mode == PQ_OUT_SAMPLE) {
        set_input(ctx, g->inp_sampler, ctx->sampler_buf, 0, sizeof(ctx->sampler_buf));
        set_input(ctx, g->inp_history, ctx->history_buf, 0, sizeof(ctx->history_buf));
    }
}

/* The embedding rows of tokens (host ids) as a pass's input. */
static void set_token_inputs(struct pq_ctx * ctx, const struct pq_graph * g, const int32_t * tokens, int32_t n) {
    if (g->inp_embd) {
        embed_rows(ctx, tokens, n);
        set_input(ctx, g->inp_embd, ctx->embd_buf, 0, ggml_nbytes(g->inp_embd));
    } else {
        set_input(ctx, g->inp_tokens, tokens, 0, sizeof(int32_t) * n);
    }
}

/* One forward pass of n tokens (n <= n_batch) at the current position. */
static int run_pass(struct pq_ctx * ctx, const int32_t * tokens, int32_t n, int32_t out_mode, void * out) {
    const int64_t t_start = ggml_time_us();
    struct pq_graph * g = get_graph(ctx, n, kv_span(ctx->n_past + n), out_mode);
    if (!g) return -1;
    set_pass_inputs(ctx, g, n);
    set_token_inputs(ctx, g, tokens, n);
    if (ggml_backend_sched_graph_compute_async(ctx->sched, g->gf) != GGML_STATUS_SUCCESS) {
        return pq_fail("the backend failed to compute the graph");
    }
    const int64_t t_wait = ggml_time_us();
    /* an output on the GPU is read by a copy queued after the pass: one wait instead of two */
    const bool out_async = out && on_gpu(ctx, g->out);
    if (out_async) ggml_backend_tensor_get_async(ctx->model->backend_gpu, g->out, out, 0, ggml_nbytes(g->out));
    ggml_backend_sched_synchronize(ctx->sched);
    const int64_t t_done = ggml_time_us();
    ctx->n_past += n;
    if (out && !out_async) ggml_backend_tensor_get(g->out, out, 0, ggml_nbytes(g->out));
    ctx->timings.n_passes += 1;
    ctx->timings.wait_us += t_done - t_wait;
    ctx->timings.host_us += (t_wait - t_start) + (ggml_time_us() - t_done);
    return 0;
}

static int check_tokens(const struct pq_ctx * ctx, const int32_t * tokens, int32_t n) {
    const int32_t n_vocab = ctx->model->hp.n_vocab;
    for (int32_t i = 0; i < n; ++i) {
        if (tokens[i] < 0 || tokens[i] >= n_vocab) {
            return pq_fail("token id %d at position %d is out of range [0, %d)", tokens[i], i, n_vocab);
        }
    }
    if (ctx->n_past + n > ctx->params.n_ctx) {
        return pq_fail("context overflow: %d tokens in the context + %d new > n_ctx=%d", ctx->n_past, n, ctx->params.n_ctx);
    }
    return 0;
}

int pq_ctx_eval(pq_ctx * ctx, const int32_t * tokens, int32_t n_tokens, int32_t logits_all, float * logits_out) {
    if (n_tokens <= 0) return pq_fail("no tokens to evaluate");
    if (check_tokens(ctx, tokens, n_tokens)) return -1;
    const int32_t n_vocab = ctx->model->hp.n_vocab;
    for (int32_t done = 0; done < n_tokens;) {
        const int32_t n = n_tokens - done < ctx->params.n_batch ? n_tokens - done : ctx->params.n_batch;
        const bool last = done + n == n_tokens;
        float * out = NULL;
        if (logits_out && logits_all) out = logits_out + (size_t) done * n_vocab;
        else if (logits_out && last) out = logits_out;
        if (run_pass(ctx, tokens + done, n, logits_all ? PQ_OUT_ALL : PQ_OUT_LAST, out)) return -1;
        done += n;
    }
    return 0;
}

#ifdef PYQWEN_WITH_CUDA
/* Queues a one-token pass without waiting for it: its embedding from the host token `token`, or where that is NULL
 * gathered on the GPU from the token of the pass queued before (whose graph this pass must share); its token lands
 * in token_slots[slot], and pass_done[slot] marks it. */
static int queue_pass(struct pq_ctx * ctx, const int32_t * token, int32_t out_mode, int slot) {
    const int64_t t_start = ggml_time_us();
    struct pq_graph * g = get_graph(ctx, 1, kv_span(ctx->n_past + 1), out_mode);
    if (!g) return -1;
    if (token) {
        set_token_inputs(ctx, g, token, 1);
    } else {
        ggml_backend_cuda_pyqwen_embed_token(ctx->model->backend_gpu, ctx->model->tok_embd, g->out, g->inp_embd);
    }
    set_pass_inputs(ctx, g, 1);
    if (ggml_backend_sched_graph_compute_async(ctx->sched, g->gf) != GGML_STATUS_SUCCESS) {
        return pq_fail("the backend failed to compute the graph");
    }
    ggml_backend_tensor_get_async(ctx->model->backend_gpu, g->out, &ctx->token_slots[slot], 0, sizeof(int32_t));
    ggml_backend_event_record(ctx->pass_done[slot], ctx->model->backend_gpu);
    ctx->n_past += 1;
    ctx->timings.n_passes += 1;
    ctx->timings.host_us += ggml_time_us() - t_start;
    return 0;
}

static int32_t take_token(struct pq_ctx * ctx, int slot) {
    const int64_t t_start = ggml_time_us();
    ggml_backend_event_synchronize(ctx->pass_done[slot]);
    ctx->timings.wait_us += ggml_time_us() - t_start;
    return ctx->token_slots[slot];
}

/* pq_ctx_generate with one pass queued ahead (struct pq_model.decode_pipeline): pass i+1 is queued, its embedding
 * gathered on the GPU from pass i's token, before the host waits for that token, so the GPU does not wait on the
 * host. Where the next pass needs a new graph (the attended span grows every PQ_KV_PAD cells) it is queued after
 * the wait, from the host. When pass i's token is a stop token, pass i+1 has fed it already (its effect on the
 * recurrent states cannot be undone), so the token that pass picked is returned too: as everywhere, every token
 * returned but the last has been fed, and a caller that goes on after the stop token gets what a new call fed
 * with it would give. */
static int32_t generate_pipelined(pq_ctx * ctx, int32_t token, int32_t n_steps, const pq_sampling * s, bool greedy,
                                  const float * uniforms, const int32_t * stop, int32_t n_stop, int32_t * out_tokens) {
    const int32_t mode = greedy ? PQ_OUT_ARGMAX : PQ_OUT_SAMPLE;
    for (int32_t j = 0; j < PQ_HISTORY; ++j) ctx->history_buf[j] = -1;  /* no repetition window here */
    if (!greedy) pq_sampler_params(s, uniforms[0], ctx->sampler_buf);
    if (queue_pass(ctx, &token, mode, 0)) goto fail;
    for (int32_t i = 0; i < n_steps; ++i) {
        const bool ahead = i + 1 < n_steps && kv_span(ctx->n_past + 1) == ctx->graph.n_kv;
        if (ahead) {
            if (!greedy) pq_sampler_params(s, uniforms[i + 1], ctx->sampler_buf);
            if (queue_pass(ctx, NULL, mode, (i + 1) % 2)) goto fail;
        }
        out_tokens[i] = take_token(ctx, i % 2);
        for (int32_t j = 0; j < n_stop; ++j) {
            if (out_tokens[i] != stop[j]) continue;
            if (!ahead) return i + 1;
            out_tokens[i + 1] = take_token(ctx, (i + 1) % 2);  /* the pass queued ahead fed the stop token */
            return i + 2;
        }
        if (!ahead && i + 1 < n_steps) {
            if (!greedy) pq_sampler_params(s, uniforms[i + 1], ctx->sampler_buf);
            if (queue_pass(ctx, &out_tokens[i], mode, (i + 1) % 2)) goto fail;
        }
    }
    return n_steps;
fail:
    ggml_backend_synchronize(ctx->model->backend_gpu);  /* a pass may still be writing its token slot */
    return -1;
}
#endif

int32_t pq_ctx_generate(pq_ctx * ctx, int32_t token, int32_t n_steps, const pq_sampling * s,
                        const int32_t * history, int32_t n_history, const float * uniforms,
                        const int32_t * stop, int32_t n_stop, int32_t * out_tokens) {
    if (n_steps <= 0) return pq_fail("n_steps must be positive, got %d", n_steps);
    if (check_tokens(ctx, &token, 1)) return -1;
    if (ctx->n_past + n_steps > ctx->params.n_ctx) {
        return pq_fail("context overflow: %d tokens in the context + %d steps > n_ctx=%d", ctx->n_past, n_steps, ctx->params.n_ctx);
    }
    /* greedy is a plain argmax in the graph, cheaper than the sampler */
    const bool greedy = s->temperature <= 0.0f && s->repeat_penalty == 1.0f;
    int32_t window = 0;  /* the penalty window: the tail of history, then of the output */
    if (!greedy) {
        window = s->repeat_penalty == 1.0f ? 0 : (s->repeat_last_n > 0 ? s->repeat_last_n : PQ_HISTORY);
        if (window > PQ_HISTORY) window = PQ_HISTORY;
    }
#ifdef PYQWEN_WITH_CUDA
    if (ctx->model->decode_pipeline && window == 0) {
        return generate_pipelined(ctx, token, n_steps, s, greedy, uniforms, stop, n_stop, out_tokens);
    }
#endif
    for (int32_t i = 0; i < n_steps; ++i) {
        if (!greedy) {
            pq_sampler_params(s, uniforms[i], ctx->sampler_buf);
            /* the last `window` tokens of history + out_tokens[0..i), left-aligned, -1 padded */
            const int32_t total = n_history + i;
            const int32_t w = total < window ? total : window;
            for (int32_t j = 0; j < PQ_HISTORY; ++j) {
                const int32_t at = total - w + j;
                ctx->history_buf[j] = j >= w ? -1 : at < n_history ? history[at] : out_tokens[at - n_history];
            }
        }
        if (run_pass(ctx, &token, 1, greedy ? PQ_OUT_ARGMAX : PQ_OUT_SAMPLE, &out_tokens[i])) return -1;
        token = out_tokens[i];
        for (int32_t j = 0; j < n_stop; ++j) {
            if (token == stop[j]) return i + 1;
        }
    }
    return n_steps;
}
