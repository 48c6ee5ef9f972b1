// CUDA kernel of GGML_OP_PYQWEN_DELTANET_PREP (include/ggml-pyqwen.h).
#pragma once

#include "common.cuh"

// heads and conv kernels within GGML_PYQWEN_DELTANET_PREP_CUDA_MAX_HEAD / _MAX_K (ggml-pyqwen.h)
bool ggml_cuda_pyqwen_deltanet_prep_supported(const ggml_tensor * op);

void ggml_cuda_op_pyqwen_deltanet_prep(ggml_backend_cuda_context & ctx, ggml_tensor * dst);

// GGML_OP_PYQWEN_DELTANET_PREP at node i, ggml_gated_delta_net over its output and the CPY of the new state
// onto the old, as pyqwen's graph builds a decode or verify pass, in one kernel; returns the nodes computed
// after node i, or 0 where the pattern or its limits (heads of 128, up to 8 tokens) do not hold.
int ggml_cuda_pyqwen_deltanet_try_fuse(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i);
