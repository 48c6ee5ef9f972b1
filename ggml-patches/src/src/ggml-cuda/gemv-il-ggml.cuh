// gemv-il-ggml.cuh: ggml's side of the interleaved skinny GEMV (gemv-il.cuh). Weights live in the
// CUDA_IL buffer type (ggml_backend_cuda_gemv_il_buffer_type), which stores eligible tensors in the
// interleaved layout and hands ggml's bytes back through get_tensor; MUL_MAT on them goes here.
#pragma once

#include "common.cuh"

// True when src0 is stored interleaved (an eligible tensor whose bytes are in a CUDA_IL buffer): they
// are not ggml's, so only ggml_cuda_mul_mat_gemv_il may read them.
bool ggml_cuda_gemv_il_owns(const ggml_tensor * src0);

// Upstream's matrix product for weights in ggml's layout (ggml_cuda_mul_mat).
using ggml_cuda_mul_mat_fn = void (*)(ggml_backend_cuda_context & ctx, const ggml_tensor * src0, const ggml_tensor * src1, ggml_tensor * dst);

// dst = src0 x src1 for an owned src0: up to 24 token rows of src1 on the GEMV, 8 per launch; a
// prefill-sized src1 goes to `upstream` with src0 moved to ggml's layout in place and back, or where a
// tile exceeds a CTA's shared memory (and for W4A8, expanded to Q8_0) slab by slab through one pool
// buffer of at most PYQWEN_GEMV_SLAB_MIB (16 MiB), so a prefill holds no whole copy of any weight.
void ggml_cuda_mul_mat_gemv_il(ggml_backend_cuda_context & ctx, const ggml_tensor * src0, const ggml_tensor * src1, ggml_tensor * dst,
                               ggml_cuda_mul_mat_fn upstream);

// Fuses the graph nodes from i on into one interleaved GEMV with a prologue (the input norms, SwiGLU, the
// gated norm) and/or an epilogue (residual ADD, ARGMAX) when they match; returns how many nodes after i
// it consumed, 0 for no fusion.
int ggml_cuda_gemv_il_try_fuse(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i);

bool ggml_backend_buft_is_cuda_gemv_il(ggml_backend_buffer_type_t buft);
