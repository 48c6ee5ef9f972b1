// CPU kernel of GGML_OP_PYQWEN_DELTANET_PREP (include/ggml-pyqwen.h), called from ggml-cpu.c.
#pragma once

#include "ggml.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ggml_compute_params;

void ggml_compute_forward_pyqwen_deltanet_prep(const struct ggml_compute_params * params, struct ggml_tensor * dst);

#ifdef __cplusplus
}
#endif
