// Graph constructor of GGML_OP_PYQWEN_DELTANET_PREP (see include/ggml-pyqwen.h); the kernels are
// ggml-cpu/pyqwen-deltanet-cpu.c and ggml-cuda/pyqwen-deltanet.cu.
#include "ggml-pyqwen.h"

#include "ggml-impl.h"

struct ggml_tensor * ggml_pyqwen_deltanet_prep(
        struct ggml_context * ctx,
        struct ggml_tensor  * qkv,
        struct ggml_tensor  * beta,
        struct ggml_tensor  * alpha,
        struct ggml_tensor  * conv_state,
        struct ggml_tensor  * conv_w,
        struct ggml_tensor  * dt_bias,
        struct ggml_tensor  * a,
        int                   n_k_heads,
        float                 eps) {
    const int64_t channels = qkv->ne[0], n_v_heads = dt_bias->ne[0], n = qkv->ne[1];
    GGML_ASSERT(n_k_heads > 0 && channels % (2 * n_k_heads + n_v_heads) == 0);
    struct ggml_tensor * rows[] = { qkv, beta, alpha };  /* [width, n], rows contiguous */
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); ++i) {
        GGML_ASSERT(rows[i]->ne[1] == n && rows[i]->ne[2] == 1 && rows[i]->ne[3] == 1 && rows[i]->nb[0] == sizeof(float));
    }
    GGML_ASSERT(beta->ne[0] == n_v_heads && alpha->ne[0] == n_v_heads);
    GGML_ASSERT(ggml_nelements(a) == n_v_heads && ggml_is_contiguous(a) && ggml_is_contiguous(dt_bias));
    GGML_ASSERT(conv_w->ne[1] == channels && conv_w->ne[0] >= 2 && ggml_is_contiguous(conv_w));
    GGML_ASSERT(conv_state->ne[0] == conv_w->ne[0] - 1 && conv_state->ne[1] == channels && ggml_is_contiguous(conv_state));
    struct ggml_tensor * srcs[] = { qkv, beta, alpha, conv_state, conv_w, dt_bias, a };
    for (size_t i = 0; i < sizeof(srcs) / sizeof(srcs[0]); ++i) {
        GGML_ASSERT(srcs[i]->type == GGML_TYPE_F32);
    }

    struct ggml_tensor * result = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, (channels + 2 * n_v_heads) * n);
    ggml_set_op_params_i32(result, 0, n_k_heads);
    ggml_set_op_params_f32(result, 1, eps);
    result->op = GGML_OP_PYQWEN_DELTANET_PREP;
    for (size_t i = 0; i < sizeof(srcs) / sizeof(srcs[0]); ++i) {
        result->src[i] = srcs[i];
    }
    return result;
}
