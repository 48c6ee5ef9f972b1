// CUDA kernel of GGML_OP_PYQWEN_DELTANET_PREP (include/ggml-pyqwen.h).
#pragma once

#include "common.cuh"

// heads and conv kernels within GGML_PYQWEN_DELTANET_PREP_CUDA_MAX_HEAD / _MAX_K (ggml-pyqwen.h)
bool ggml_cuda_pyqwen_deltanet_prep_supported(const ggml_tensor * op);

void ggml_cuda_op_pyqwen_deltanet_prep(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
