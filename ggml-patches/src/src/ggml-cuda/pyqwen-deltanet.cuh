// CUDA kernel of GGML_OP_PYQWEN_DELTANET_PREP (include/ggml-pyqwen.h).
#pragma once

#include "common.cuh"

void ggml_cuda_op_pyqwen_deltanet_prep(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
