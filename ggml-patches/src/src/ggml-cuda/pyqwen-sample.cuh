// CUDA kernel of GGML_OP_PYQWEN_SAMPLE (include/ggml-pyqwen.h), called from ggml-cuda.cu.
#pragma once

#include "common.cuh"

void ggml_cuda_op_pyqwen_sample(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
bool ggml_cuda_pyqwen_sample_supported(const ggml_tensor * op);
