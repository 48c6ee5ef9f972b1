// Graph constructor of GGML_OP_PYQWEN_HADAMARD (see include/ggml-pyqwen.h); the kernel is in
// ggml-cpu/pyqwen-hadamard-cpu.c.
#include "ggml-pyqwen.h"

#include "ggml-impl.h"

struct ggml_tensor * ggml_pyqwen_hadamard(
        struct ggml_context * ctx,
        struct ggml_tensor  * a,
        int                   n) {
    GGML_ASSERT(a->type == GGML_TYPE_F32);
    GGML_ASSERT(n >= 4 && (n & (n - 1)) == 0 && (n & 0x55555555) != 0);  // a power of 4
    GGML_ASSERT(a->ne[0] % n == 0);
    GGML_ASSERT(a->nb[0] == sizeof(float));

    struct ggml_tensor * result = ggml_new_tensor(ctx, GGML_TYPE_F32, GGML_MAX_DIMS, a->ne);

    const int32_t params[1] = { n };
    ggml_set_op_params(result, params, sizeof(params));
    result->op     = GGML_OP_PYQWEN_HADAMARD;
    result->src[0] = a;

    return result;
}
