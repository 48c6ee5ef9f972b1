/* The Qwen3.5 forward graph: Gated DeltaNet layers, gated full attention every
 * full_attn_interval-th layer, SwiGLU FFN. Built once per shape and replayed. */
#include "pq-internal.h"

#include <math.h>

#define PQ_GRAPH_SIZE 16384
/* Passes of up to this many tokens (decode, draft verification) take GGML_OP_PYQWEN_DELTANET_PREP, whose
 * kernels walk the tokens one by one; longer ones take the unfused ops, parallel over tokens. */
#define PQ_DELTANET_PREP_MAX_TOKENS 8

static struct ggml_tensor * norm(struct ggml_context * c, struct ggml_tensor * x, struct ggml_tensor * w, float eps) {
    return ggml_mul(c, ggml_rms_norm(c, x, eps), w);
}

/* Rows [first, first + count) of every column of a matrix product's output [rows, n]: a view, made
 * contiguous only where a consumer needs it and n > 1 leaves gaps. */
static struct ggml_tensor * rows(struct ggml_context * c, struct ggml_tensor * y, int64_t first, int64_t count, bool contiguous) {
    struct ggml_tensor * v = ggml_view_2d(c, y, count, y->ne[1], y->nb[1], first * ggml_element_size(y));
    return contiguous && !ggml_is_contiguous(v) ? ggml_cont(c, v) : v;
}

/* x / sqrt(sum(x^2) + eps) along rows, written as an RMS norm so it is one fused op. */
static struct ggml_tensor * l2_norm(struct ggml_context * c, struct ggml_tensor * x, float eps) {
    const float n = (float) x->ne[0];
    return ggml_scale(c, ggml_rms_norm(c, x, eps / n), 1.0f / sqrtf(n));
}

static struct ggml_tensor * deltanet_block(struct pq_ctx * ctx, struct ggml_context * c, struct ggml_cgraph * gf,
                                           struct ggml_tensor * h, int il) {
    const struct pq_model * m = ctx->model;
    const struct pq_hparams * hp = &m->hp;
    const struct pq_layer * L = &m->layers[il];
    const int64_t n = h->ne[1];
    const int64_t S = hp->ssm_d_state, HK = hp->ssm_n_k_heads, HV = hp->ssm_n_v_heads;
    const int64_t C = pq_conv_channels(hp), K1 = hp->conv_kernel - 1;

    /* decode and draft-verify passes: one op for the conv step, SiLU, q/k norms, decay and beta (its
     * CUDA kernel keeps a head's channels and conv state in registers: the limits of every Qwen3.x) */
    const bool prep = n <= PQ_DELTANET_PREP_MAX_TOKENS && S <= GGML_PYQWEN_DELTANET_PREP_CUDA_MAX_HEAD &&
                      K1 + 1 <= GGML_PYQWEN_DELTANET_PREP_CUDA_MAX_K;
    struct ggml_tensor * qkv, * z, * beta, * alpha;                              /* [C | HV*S | HV | HV, n] */
    if (L->in_proj) {
        struct ggml_tensor * y = pq_linear(m, c, L->in_proj, h);
        qkv   = rows(c, y, 0, C, false);
        z     = rows(c, y, C, HV * S, true);
        beta  = rows(c, y, C + HV * S, HV, !prep);
        alpha = rows(c, y, C + HV * S + HV, HV, false);
    } else {
        qkv   = pq_linear(m, c, L->wqkv, h);
        z     = pq_linear(m, c, L->wz, h);
        beta  = pq_linear(m, c, L->w_beta, h);
        alpha = pq_linear(m, c, L->w_alpha, h);
    }
    /* z's node (a CONT in passes of several rows) goes here, not between the gated norm's MUL and
     * its SiLU, where it would break the gated-norm prologue fusion of ssm_out (ggml-cuda) */
    ggml_build_forward_expand(gf, z);
    struct ggml_tensor * conv_state = ctx->conv_state[il];                      /* [K1, C] */
    const size_t es = sizeof(float);
    struct ggml_tensor * q, * k, * v, * gate;
    if (prep) {
        /* also advances conv_state; p = [q | k | v] per token, then g [HV, n], then beta [HV, n] */
        struct ggml_tensor * p = ggml_pyqwen_deltanet_prep(c, qkv, beta, alpha, conv_state, L->conv1d, L->dt_bias,
                                                           L->ssm_a, (int) HK, hp->norm_eps);
        q    = ggml_view_4d(c, p, S, HK, n, 1, S * es, C * es, C * n * es, 0);
        k    = ggml_view_4d(c, p, S, HK, n, 1, S * es, C * es, C * n * es, S * HK * es);
        v    = ggml_view_4d(c, p, S, HV, n, 1, S * es, C * es, C * n * es, 2 * S * HK * es);
        gate = ggml_view_1d(c, p, HV * n, C * n * es);
        beta = ggml_view_1d(c, p, HV * n, (C + HV) * n * es);
    } else {
        beta = ggml_sigmoid(c, beta);
        /* decay g = -exp(A_log) * softplus(alpha + dt_bias), kept in log space for the op */
        gate = ggml_mul(c, ggml_softplus(c, ggml_add(c, alpha, L->dt_bias)), L->ssm_a);

        /* causal conv1d over [previous K1 inputs | this pass], then keep the last K1 as new state */
        struct ggml_tensor * conv_in = ggml_concat(c, conv_state, ggml_transpose(c, qkv), 0); /* [K1+n, C] */
        ggml_build_forward_expand(gf, ggml_cpy(c,
            ggml_view_2d(c, conv_in, K1, C, conv_in->nb[1], n * ggml_element_size(conv_in)), conv_state));
        struct ggml_tensor * conv = ggml_silu(c, ggml_ssm_conv(c, ggml_reshape_3d(c, conv_in, K1 + n, C, 1), L->conv1d)); /* [C, n, 1] */

        q = ggml_view_4d(c, conv, S, HK, n, 1, S * es, conv->nb[1], conv->nb[2], 0);
        k = ggml_view_4d(c, conv, S, HK, n, 1, S * es, conv->nb[1], conv->nb[2], S * HK * es);
        v = ggml_view_4d(c, conv, S, HV, n, 1, S * es, conv->nb[1], conv->nb[2], 2 * S * HK * es);
        q = l2_norm(c, q, hp->norm_eps);
        k = l2_norm(c, k, hp->norm_eps);
    }

    struct ggml_tensor * state = ctx->ssm_state[il];                            /* [S, S, HV, 1] */
    struct ggml_tensor * out = ggml_gated_delta_net(c, q, k, v,
        ggml_reshape_4d(c, gate, 1, HV, n, 1), ggml_reshape_4d(c, beta, 1, HV, n, 1), state, 1);
    struct ggml_tensor * attn = ggml_view_3d(c, out, S, HV, n, S * es, S * HV * es, 0);
    /* the new state (after the outputs) back into the context's: both as flat views of its D
     * values, the form ggml-cuda fuses into the recurrence kernel, which then writes the state in
     * place instead of into the output for a copy (2 MB per layer and token at the 9B shape) */
    const int64_t D = S * S * HV;
    ggml_build_forward_expand(gf, ggml_cpy(c, ggml_view_1d(c, out, D, S * HV * n * es),
                                           ggml_view_3d(c, state, D, 1, 1, D * es, D * es, 0)));

    /* gated RMSNorm with z, then the output projection */
    struct ggml_tensor * o = ggml_mul(c, norm(c, attn, L->ssm_norm, hp->norm_eps),
                                      ggml_silu(c, ggml_reshape_3d(c, z, S, HV, n)));
    /* a rotated ssm_out keeps the checkpoint's grouped V-head column order (pq-linear.c) */
    o = pq_rotation(m, L->ssm_out) && HK != HV ? pq_v_heads_grouped(c, o, HK) : ggml_reshape_2d(c, o, S * HV, n);
    return pq_linear(m, c, L->ssm_out, o);
}

static struct ggml_tensor * attention_block(struct pq_ctx * ctx, struct pq_graph * g, struct ggml_context * c,
                                            struct ggml_cgraph * gf, struct ggml_tensor * h, int il) {
    const struct pq_model * m = ctx->model;
    const struct pq_hparams * hp = &m->hp;
    const struct pq_layer * L = &m->layers[il];
    const int64_t n = h->ne[1], D = hp->head_dim, NH = hp->n_head, NKV = hp->n_head_kv;

    /* q_proj holds, per head, D query rows followed by D gate rows */
    struct ggml_tensor * qg, * k, * v;                                          /* [2*D*NH | D*NKV | D*NKV, n] */
    if (L->qkv_proj) {
        struct ggml_tensor * y = pq_linear(m, c, L->qkv_proj, h);
        qg = rows(c, y, 0, 2 * D * NH, false);
        k  = rows(c, y, 2 * D * NH, D * NKV, false);
        v  = rows(c, y, 2 * D * NH + D * NKV, D * NKV, false);
    } else {
        qg = pq_linear(m, c, L->wq, h);
        k  = pq_linear(m, c, L->wk, h);
        v  = pq_linear(m, c, L->wv, h);
    }
    const size_t es = ggml_element_size(qg);
    struct ggml_tensor * q = ggml_view_3d(c, qg, D, NH, n, 2 * D * es, qg->nb[1], 0);
    struct ggml_tensor * gate = ggml_cont_2d(c, ggml_view_3d(c, qg, D, NH, n, 2 * D * es, qg->nb[1], D * es), D * NH, n);
    q = norm(c, q, L->q_norm, hp->norm_eps);
    k = norm(c, ggml_view_3d(c, k, D, NKV, n, D * es, k->nb[1], 0), L->k_norm, hp->norm_eps);

    /* Text positions are equal in all M-RoPE sections, which makes interleaved M-RoPE plain NeoX
     * rotation of the first n_rot dims. */
    q = ggml_rope_ext(c, q, g->inp_pos, NULL, hp->n_rot, GGML_ROPE_TYPE_NEOX, 0, hp->rope_base, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
    k = ggml_rope_ext(c, k, g->inp_pos, NULL, hp->n_rot, GGML_ROPE_TYPE_NEOX, 0, hp->rope_base, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);

    struct ggml_tensor * kc = ctx->k_cache[il], * vc = ctx->v_cache[il];        /* [D*NKV, n_ctx] */
    /* a view (not a reshape) of the roped k: ggml-cuda fuses norm, rope, view and set_rows into one kernel */
    ggml_build_forward_expand(gf, ggml_set_rows(c, kc, ggml_view_2d(c, k, D * NKV, n, k->nb[2], 0), g->inp_kv_idx));
    ggml_build_forward_expand(gf, ggml_set_rows(c, vc, v, g->inp_kv_idx));
    struct ggml_tensor * K = ggml_view_3d(c, kc, D, g->n_kv, NKV, kc->nb[1], ggml_row_size(kc->type, D), 0);
    struct ggml_tensor * V = ggml_view_3d(c, vc, D, g->n_kv, NKV, vc->nb[1], ggml_row_size(vc->type, D), 0);

    struct ggml_tensor * a = ggml_flash_attn_ext(c, ggml_permute(c, q, 0, 2, 1, 3), K, V, g->mask,
                                                 1.0f / sqrtf((float) D), 0.0f, 0.0f);  /* [D, NH, n] */
    a = ggml_mul(c, ggml_reshape_2d(c, a, D * NH, n), ggml_sigmoid(c, gate));
    return pq_linear(m, c, L->wo, a);
}

static struct ggml_tensor * ffn_block(const struct pq_model * m, struct ggml_context * c, const struct pq_layer * L,
                                      struct ggml_tensor * h) {
    struct ggml_tensor * act = L->gate_up ? ggml_swiglu(c, pq_linear(m, c, L->gate_up, h))  /* silu(first half) * second */
                                          : ggml_swiglu_split(c, pq_linear(m, c, L->ffn_gate, h), pq_linear(m, c, L->ffn_up, h));
    return pq_linear(m, c, L->ffn_down, act);
}

struct ggml_cgraph * pq_build_graph(struct pq_ctx * ctx, struct pq_graph * g) {
    const struct pq_model * m = ctx->model;
    const struct pq_hparams * hp = &m->hp;
    const int64_t n = g->n_tokens;

    struct ggml_init_params ip = {
        .mem_size = ggml_tensor_overhead() * PQ_GRAPH_SIZE + ggml_graph_overhead_custom(PQ_GRAPH_SIZE, false),
        .mem_buffer = NULL,
        .no_alloc = true,
    };
    struct ggml_context * c = ggml_init(ip);
    if (!c) return NULL;
    g->ctx = c;
    struct ggml_cgraph * gf = ggml_new_graph_custom(c, PQ_GRAPH_SIZE, false);

    /* A short pass (decode, draft verification) gets its token embeddings from the host (run_pass
     * dequantizes the rows): the table stays in host memory, so a lookup in the graph would be a CPU
     * split of its own and a blocking copy of its rows to the GPU. */
    g->inp_embd   = n <= PQ_SHORT_PASS_TOKENS ? ggml_new_tensor_2d(c, GGML_TYPE_F32, hp->n_embd, n) : NULL;
    g->inp_tokens = g->inp_embd ? NULL : ggml_new_tensor_1d(c, GGML_TYPE_I32, n);
    g->inp_pos    = ggml_new_tensor_1d(c, GGML_TYPE_I32, n);
    g->inp_kv_idx = ggml_new_tensor_1d(c, GGML_TYPE_I64, n);
    /* one token sees every cell written so far: the context's kv_seen row; more see a causal mask */
    g->inp_mask   = n > 1 ? ggml_new_tensor_2d(c, GGML_TYPE_F16, g->n_kv, n) : NULL;
    g->mask       = g->inp_mask ? g->inp_mask : ggml_view_1d(c, ctx->kv_seen, g->n_kv, 0);
    ggml_set_input(g->inp_embd ? g->inp_embd : g->inp_tokens);
    ggml_set_input(g->inp_pos);
    ggml_set_input(g->inp_kv_idx);
    if (g->inp_mask) ggml_set_input(g->inp_mask);

    struct ggml_tensor * x = g->inp_embd ? g->inp_embd : ggml_get_rows(c, m->tok_embd, g->inp_tokens); /* [E, n] */
    for (int il = 0; il < hp->n_layer; ++il) {
        const struct pq_layer * L = &m->layers[il];
        struct ggml_tensor * h = norm(c, x, L->attn_norm, hp->norm_eps);
        h = pq_is_recurrent(hp, il) ? deltanet_block(ctx, c, gf, h, il) : attention_block(ctx, g, c, gf, h, il);
        x = ggml_add(c, x, h);
        x = ggml_add(c, x, ffn_block(m, c, L, norm(c, x, L->post_norm, hp->norm_eps)));
    }
    if (g->out_mode != PQ_OUT_ALL) {
        x = ggml_view_2d(c, x, hp->n_embd, 1, x->nb[1], (n - 1) * x->nb[1]);   /* only the last row */
    }
    struct ggml_tensor * logits = pq_linear(m, c, m->output, norm(c, x, m->output_norm, hp->norm_eps));
    if (g->out_mode == PQ_OUT_SAMPLE) {
        g->inp_sampler = ggml_new_tensor_2d(c, GGML_TYPE_F32, GGML_PYQWEN_SAMPLE_N_PARAMS, 1);
        g->inp_history = ggml_new_tensor_2d(c, GGML_TYPE_I32, PQ_HISTORY, 1);
        ggml_set_input(g->inp_sampler);
        ggml_set_input(g->inp_history);
        g->out = ggml_pyqwen_sample(c, logits, g->inp_sampler, g->inp_history);
    } else {
        g->out = g->out_mode == PQ_OUT_ARGMAX ? ggml_argmax(c, logits) : logits;
    }
    ggml_set_output(g->out);
    ggml_build_forward_expand(gf, g->out);
    return gf;
}
