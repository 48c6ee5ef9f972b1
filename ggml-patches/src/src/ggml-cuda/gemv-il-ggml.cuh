// gemv-il-ggml.cuh: ggml's side of the interleaved skinny GEMV (gemv-il.cuh). Weights live in the
// CUDA_IL buffer type (ggml_backend_cuda_gemv_il_buffer_type), which stores eligible tensors in the
// interleaved layout and hands ggml's bytes back through get_tensor; MUL_MAT on them goes here.
#pragma once

#include "common.cuh"

// True when src0 is stored interleaved (eligible tensor in a CUDA_IL buffer): its bytes are not
// ggml's, so only ggml_cuda_mul_mat_gemv_il may read it.
bool ggml_cuda_gemv_il_owns(const ggml_tensor * src0);

// dst = src0 x src1 for an owned src0, 8 token rows of src1 per GEMV launch; returns true. For a
// prefill-sized src1 it returns false instead, with `plain` = src0 de-interleaved into `plain_data`
// (pool memory that must live until upstream's kernels have read it).
bool ggml_cuda_mul_mat_gemv_il(ggml_backend_cuda_context & ctx, const ggml_tensor * src0, const ggml_tensor * src1, ggml_tensor * dst,
                               ggml_tensor & plain, ggml_cuda_pool_alloc<uint8_t> & plain_data);

// Fuses the graph nodes from i on into one interleaved GEMV with a prologue (RMS_NORM -> MUL -> MUL_MAT,
// SWIGLU -> MUL_MAT) when they match; returns how many nodes after i it consumed, 0 for no fusion.
int ggml_cuda_gemv_il_try_fuse(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i);

bool ggml_backend_buft_is_cuda_gemv_il(ggml_backend_buffer_type_t buft);
