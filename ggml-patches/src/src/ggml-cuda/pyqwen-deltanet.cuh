// CUDA kernel of GGML_OP_PYQWEN_DELTANET_PREP (include/ggml-pyqwen.h).
#pragma once

#include "common.cuh"

// heads of up to 512 channels, conv kernels up to 8 wide
bool ggml_cuda_pyqwen_deltanet_prep_supported(const ggml_tensor * op);

void ggml_cuda_op_pyqwen_deltanet_prep(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
