// CPU kernel of GGML_OP_PYQWEN_HADAMARD (include/ggml-pyqwen.h), called from ggml-cpu.c.
#pragma once

#include "ggml.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ggml_compute_params;

void ggml_compute_forward_pyqwen_hadamard(const struct ggml_compute_params * params, struct ggml_tensor * dst);

#ifdef __cplusplus
}
#endif
