/* Linear layers whose weights need more than ggml_mul_mat: weights stored in the Hadamard basis
 * of ComfyUI's ConvRot (their activations are rotated first, GGML_OP_PYQWEN_HADAMARD) and the
 * pyqwen-only type GGML_TYPE_PQ_W4A8 (its codebook is attached as it is read; on a GPU the interleaved
 * GEMV multiplies it as it is, and a GPU buffer that does not store it interleaved gets Q8_0 blocks with
 * the same int8 values).
 *
 * GGUF metadata, written by pyqwen-convert (convert/comfy.py):
 *   pyqwen.requires                   string array; the pyqwen extensions the file needs
 *   pyqwen.hadamard.<tensor>          uint32 n: the tensor holds W·H per n columns (n a power of 4)
 *   pyqwen.w4a8.codebook.<tensor>     float32[16]: codebook of a PQ_W4A8 tensor (none: uniform)
 * and, in every file that has pyqwen.requires, a one-element tensor of the same name that no model
 * uses: upstream llama.cpp refuses a file with more tensors than it loads, and would otherwise run
 * rotated Q8_0 weights as plain ones. pq_model_load loads tensors by name and skips it.
 * A rotated weight keeps the checkpoint's column order. For ssm_out that is the grouped V-head
 * order, not llama.cpp's tiled one, so the graph hands it the attention output regrouped
 * (pq_v_heads_grouped). */
#include "pq-internal.h"

#include <stdio.h>
#include <string.h>

static const char * const PQ_KNOWN_REQUIREMENTS[] = { "hadamard", "pq_w4a8" };

int pq_check_requires(const struct gguf_context * g) {
    const int64_t id = gguf_find_key(g, "pyqwen.requires");
    if (id < 0) return 0;
    if (gguf_get_kv_type(g, id) != GGUF_TYPE_ARRAY || gguf_get_arr_type(g, id) != GGUF_TYPE_STRING) {
        return pq_fail("GGUF metadata key pyqwen.requires is not a string array");
    }
    for (size_t i = 0; i < gguf_get_arr_n(g, id); ++i) {
        const char * req = gguf_get_arr_str(g, id, i);
        bool known = false;
        for (size_t k = 0; k < sizeof(PQ_KNOWN_REQUIREMENTS) / sizeof(PQ_KNOWN_REQUIREMENTS[0]); ++k) {
            known |= strcmp(req, PQ_KNOWN_REQUIREMENTS[k]) == 0;
        }
        if (!known) return pq_fail("the model needs pyqwen feature '%s', which this pyqwen %s lacks (upgrade pyqwen)", req, pq_version());
    }
    return 0;
}

int32_t pq_rotation(const struct pq_model * m, const struct ggml_tensor * w) {
    for (int32_t i = 0; i < m->n_rotated; ++i) {
        if (m->rotated[i].w == w) return m->rotated[i].n;
    }
    return 0;
}

int64_t pq_rotation_key(const struct gguf_context * g, const char * name) {
    char key[160];
    snprintf(key, sizeof(key), "pyqwen.hadamard.%s", name);
    return gguf_find_key(g, key);
}

int pq_load_rotation(struct pq_model * m, const struct gguf_context * g, const char * name, const struct ggml_tensor * w,
                     bool matmul_weight) {
    const int64_t id = pq_rotation_key(g, name);
    if (id < 0) return 0;
    const char * key = gguf_get_key(g, id);
    const enum gguf_type kt = gguf_get_kv_type(g, id);
    const int64_t n = kt == GGUF_TYPE_UINT32 ? (int64_t) gguf_get_val_u32(g, id) : -1;
    if (n < 4 || (n & (n - 1)) != 0 || (n & 0x55555555) == 0 || w->ne[0] % n != 0) {
        return pq_fail("GGUF metadata key %s must be a uint32 power of 4 dividing the row length %lld", key, (long long) w->ne[0]);
    }
    if (!matmul_weight) return pq_fail("tensor %s is marked rotated (%s) but is not a matrix-product weight", name, key);
    if (m->n_rotated >= (int32_t) (sizeof(m->rotated) / sizeof(m->rotated[0]))) return pq_fail("too many rotated tensors");
    m->rotated[m->n_rotated++] = (struct pq_rotated) { w, (int32_t) n };
    return 0;
}

int pq_load_codebook(const struct gguf_context * g, const char * name, void * blocks, int64_t n_blocks) {
    char key[160];
    snprintf(key, sizeof(key), "pyqwen.w4a8.codebook.%s", name);
    const int64_t id = gguf_find_key(g, key);
    const float * codebook = NULL;
    if (id >= 0) {
        if (gguf_get_kv_type(g, id) != GGUF_TYPE_ARRAY || gguf_get_arr_type(g, id) != GGUF_TYPE_FLOAT32 ||
            gguf_get_arr_n(g, id) != 16) {
            return pq_fail("GGUF metadata key %s must be an array of 16 float32", key);
        }
        codebook = gguf_get_arr_data(g, id);
    }
    if (pq_w4a8_set_codebook(blocks, n_blocks, codebook)) {
        return pq_fail("tensor %s: %s", name, pq_last_error());
    }
    return 0;
}

int pq_w4a8_set_codebook(void * blocks, int64_t n_blocks, const float * codebook) {
    const int32_t id = codebook ? ggml_pyqwen_w4a8_codebook(codebook) : 0;
    if (id < 0) return pq_fail("invalid pq_w4a8 codebook (a value is not finite, or too many codebooks are loaded)");
    ggml_pyqwen_w4a8_set_codebook(blocks, n_blocks, id);
    return 0;
}

int pq_w4a8_to_q8_0(const void * blocks, void * out, int64_t n) {
    if (n <= 0 || n % GGML_PYQWEN_W4A8_BLOCK != 0) {
        return pq_fail("pq_w4a8 data is whole blocks of %d values, got %lld", GGML_PYQWEN_W4A8_BLOCK, (long long) n);
    }
    ggml_pyqwen_w4a8_to_q8_0(blocks, out, n);
    return 0;
}

enum ggml_type pq_gpu_weight_type(enum ggml_type type) {
    return type == GGML_TYPE_PQ_W4A8 ? GGML_TYPE_Q8_0 : type;
}

bool pq_gpu_can_multiply(ggml_backend_t gpu, const struct ggml_tensor * w, enum ggml_type type) {
    /* a one-token product with w stored as `type`, as the graph builds it, asked of the backend */
    struct ggml_tensor wt = { .type = type, .ne = { w->ne[0], w->ne[1], 1, 1 } };
    struct ggml_tensor x = { .type = GGML_TYPE_F32, .ne = { w->ne[0], 1, 1, 1 } };
    wt.nb[0] = ggml_type_size(type);
    wt.nb[1] = ggml_row_size(type, w->ne[0]);
    x.nb[0] = sizeof(float);
    for (int i = 1; i < GGML_MAX_DIMS; ++i) {
        if (i > 1) wt.nb[i] = wt.nb[i - 1] * (size_t) wt.ne[i - 1];
        x.nb[i] = x.nb[i - 1] * (size_t) x.ne[i - 1];
    }
    struct ggml_tensor op = { .type = GGML_TYPE_F32, .op = GGML_OP_MUL_MAT, .ne = { w->ne[1], 1, 1, 1 }, .src = { &wt, &x } };
    return ggml_backend_supports_op(gpu, &op);
}

struct ggml_tensor * pq_linear(const struct pq_model * m, struct ggml_context * c, struct ggml_tensor * w, struct ggml_tensor * x) {
    const int32_t n = pq_rotation(m, w);
    return ggml_mul_mat(c, w, n ? ggml_pyqwen_hadamard(c, x, n) : x);
}

struct ggml_tensor * pq_v_heads_grouped(struct ggml_context * c, struct ggml_tensor * x, int64_t n_k_heads) {
    /* x [S, HV, n] in tiled order (head j*HK + k) -> [S*HV, n] in grouped order (head k*r + j) */
    const int64_t S = x->ne[0], HV = x->ne[1], n = x->ne[2], r = HV / n_k_heads;
    struct ggml_tensor * t = ggml_reshape_4d(c, x, S, n_k_heads, r, n);
    return ggml_reshape_2d(c, ggml_cont(c, ggml_permute(c, t, 0, 2, 1, 3)), S * HV, n);
}

/* ---- one-node CPU graphs for the tests ---- */

#define THREADS 3  /* several threads, so the row split is exercised */

static bool valid_rotation(int32_t n, int64_t n_per_row) {
    return n >= 4 && (n & (n - 1)) == 0 && (n & 0x55555555) != 0 && n_per_row % n == 0;
}

int pq_hadamard(const float * x, int64_t n_per_row, int64_t n_rows, int32_t n, float * out) {
    if (!valid_rotation(n, n_per_row) || n_rows <= 0) return pq_fail("hadamard: n=%d must be a power of 4 dividing %lld", n, (long long) n_per_row);
    struct ggml_context * ctx = pq_small_ctx();
    if (!ctx) return pq_fail("out of memory");
    struct ggml_tensor * a = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_per_row, n_rows);
    const void * data[1] = { x };
    const int rc = pq_run_on_cpu(ctx, ggml_pyqwen_hadamard(ctx, a, n), &a, data, 1, THREADS, out, NULL);
    ggml_free(ctx);
    return rc;
}

int pq_mul_mat(int32_t type, const void * w, int64_t n_rows, int64_t n_per_row, const float * x, int64_t n_cols,
               int32_t hadamard, float * out) {
    if (pq_type_row_size(type, n_per_row) < 0) return -1;
    if (!ggml_get_type_traits_cpu((enum ggml_type) type)->vec_dot) return pq_fail("no CPU matrix product for type %d", type);
    if (n_rows <= 0 || n_cols <= 0) return pq_fail("mul_mat: empty matrix");
    if (hadamard && !valid_rotation(hadamard, n_per_row)) return pq_fail("mul_mat: bad rotation %d", hadamard);
    struct ggml_context * ctx = pq_small_ctx();
    if (!ctx) return pq_fail("out of memory");
    struct ggml_tensor * in[2] = { ggml_new_tensor_2d(ctx, (enum ggml_type) type, n_per_row, n_rows),
                                   ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_per_row, n_cols) };
    struct ggml_tensor * xr = hadamard ? ggml_pyqwen_hadamard(ctx, in[1], hadamard) : in[1];
    const void * data[2] = { w, x };
    const int rc = pq_run_on_cpu(ctx, ggml_mul_mat(ctx, in[0], xr), in, data, 2, THREADS, out, NULL);
    ggml_free(ctx);
    return rc;
}

int pq_deltanet_prep(const float * y, int64_t width, int64_t n_tokens, int64_t beta_col, int64_t alpha_col,
                     float * conv_state, const float * conv_w, int32_t conv_kernel, const float * dt_bias, const float * a,
                     int32_t n_k_heads, int32_t n_v_heads, int32_t head_dim, float eps, float * out) {
    const int64_t C = (int64_t) (2 * n_k_heads + n_v_heads) * head_dim;
    if (n_k_heads <= 0 || n_v_heads <= 0 || head_dim <= 0 || n_tokens <= 0 || conv_kernel < 2 || width < C ||
        beta_col < C || alpha_col < C || beta_col + n_v_heads > width || alpha_col + n_v_heads > width) {
        return pq_fail("deltanet_prep: bad shape (heads %d/%d of %d, width %lld, beta at %lld, alpha at %lld)",
                       n_k_heads, n_v_heads, head_dim, (long long) width, (long long) beta_col, (long long) alpha_col);
    }
    struct ggml_context * ctx = pq_small_ctx();
    if (!ctx) return pq_fail("out of memory");
    struct ggml_tensor * in[5] = { ggml_new_tensor_2d(ctx, GGML_TYPE_F32, width, n_tokens),
                                   ggml_new_tensor_2d(ctx, GGML_TYPE_F32, conv_kernel - 1, C),
                                   ggml_new_tensor_2d(ctx, GGML_TYPE_F32, conv_kernel, C),
                                   ggml_new_tensor_1d(ctx, GGML_TYPE_F32, n_v_heads),
                                   ggml_new_tensor_1d(ctx, GGML_TYPE_F32, n_v_heads) };
    /* qkv, beta and alpha are views of each token's row, as of the stacked input projection's output */
    const size_t row = in[0]->nb[1], es = sizeof(float);
    struct ggml_tensor * prep = ggml_pyqwen_deltanet_prep(ctx, ggml_view_2d(ctx, in[0], C, n_tokens, row, 0),
        ggml_view_2d(ctx, in[0], n_v_heads, n_tokens, row, (size_t) beta_col * es),
        ggml_view_2d(ctx, in[0], n_v_heads, n_tokens, row, (size_t) alpha_col * es), in[1], in[2], in[3], in[4], n_k_heads, eps);
    const void * data[5] = { y, conv_state, conv_w, dt_bias, a };
    void * const back[5] = { NULL, conv_state, NULL, NULL, NULL };
    const int rc = pq_run_on_cpu(ctx, prep, in, data, 5, THREADS, out, back);
    ggml_free(ctx);
    return rc;
}
