// Graph constructor of GGML_OP_PYQWEN_SAMPLE (see include/ggml-pyqwen.h); the kernel is in
// ggml-cpu/pyqwen-sample-cpu.c.
#include "ggml-pyqwen.h"

#include <stdint.h>

struct ggml_tensor * ggml_pyqwen_sample(
        struct ggml_context * ctx,
        struct ggml_tensor  * logits,
        struct ggml_tensor  * params,
        struct ggml_tensor  * history) {
    GGML_ASSERT(logits->type  == GGML_TYPE_F32);
    GGML_ASSERT(params->type  == GGML_TYPE_F32);
    GGML_ASSERT(history->type == GGML_TYPE_I32);
    GGML_ASSERT(ggml_is_matrix(logits) && ggml_is_matrix(params) && ggml_is_matrix(history));
    GGML_ASSERT(logits->ne[0] > 0 && logits->ne[0] <= INT32_MAX);
    GGML_ASSERT(params->ne[0]  == GGML_PYQWEN_SAMPLE_N_PARAMS);
    GGML_ASSERT(params->ne[1]  == logits->ne[1]);
    GGML_ASSERT(history->ne[1] == logits->ne[1]);
    // rows may be views into larger tensors, but each row must be contiguous
    GGML_ASSERT(logits->nb[0]  == sizeof(float));
    GGML_ASSERT(params->nb[0]  == sizeof(float));
    GGML_ASSERT(history->nb[0] == sizeof(int32_t));

    struct ggml_tensor * result = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, logits->ne[1]);

    result->op     = GGML_OP_PYQWEN_SAMPLE;
    result->src[0] = logits;
    result->src[1] = params;
    result->src[2] = history;

    return result;
}
