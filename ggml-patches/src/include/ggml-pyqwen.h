// pyqwen additions to ggml: ops and a weight type that are not upstream, registered by
// ggml-patches/*.patch.
//
// GGML_OP_PYQWEN_SAMPLE picks one token per row of logits inside the graph, so that decoding
// reads back one int32 instead of a row of n_vocab floats. The sampler is llama.cpp's chain in
// this order: repetition penalty over a history window, top-k, top-p, min-p (both on the
// untempered distribution), temperature, then one draw with a caller-supplied uniform number.
// The settings are tensor inputs, not op params, so one built graph serves any sampler.
#pragma once

#include "ggml.h"

#ifdef __cplusplus
extern "C" {
#endif

    // Column of the params tensor holding each setting (params is F32 [GGML_PYQWEN_SAMPLE_N_PARAMS, n_rows]).
    enum ggml_pyqwen_sample_param {
        GGML_PYQWEN_SAMPLE_TEMPERATURE    = 0, // <= 0: greedy argmax after the penalty
        GGML_PYQWEN_SAMPLE_TOP_K          = 1, // integer-valued; < 1 or >= n_vocab: whole vocabulary
        GGML_PYQWEN_SAMPLE_TOP_P          = 2, // >= 1: off
        GGML_PYQWEN_SAMPLE_MIN_P          = 3, // <= 0: off; relative to the most likely token
        GGML_PYQWEN_SAMPLE_REPEAT_PENALTY = 4, // 1: off; divides positive logits, multiplies negative ones
        GGML_PYQWEN_SAMPLE_UNIFORM        = 5, // the draw, in [0, 1)
        GGML_PYQWEN_SAMPLE_N_PARAMS       = 8, // columns 6 and 7 are reserved (write 0)
    };

    // Samples one token id per row.
    //   logits  F32 [n_vocab, n_rows]  rows may be strided (a view), elements contiguous
    //   params  F32 [GGML_PYQWEN_SAMPLE_N_PARAMS, n_rows]
    //   history I32 [n_hist, n_rows]   tokens the penalty applies to, each id once however often
    //                                  it occurs; -1 (or any id outside [0, n_vocab)) is an empty slot
    //   result  I32 [n_rows]
    // Ties go to the lowest id. NaN logits are never chosen; a row whose logits are all NaN gives -1.
    // If the best logit is +-inf the row is decided greedily. The CPU and CUDA backends implement the
    // op (CUDA for vocabularies up to 2^20); elsewhere the scheduler places it on the CPU.
    GGML_API struct ggml_tensor * ggml_pyqwen_sample(
            struct ggml_context * ctx,
            struct ggml_tensor  * logits,
            struct ggml_tensor  * params,
            struct ggml_tensor  * history);

    // GGML_TYPE_PQ_W4A8 keeps ComfyUI's `asym_w4a8_int8` weights (symmetric, codebook) at 4 bits.
    // A block holds 256 columns of one row: the channel scale d (f32, the same in every block of a
    // row), a codebook id, one e4m3fn relative scale per 16 columns and the 4-bit codes (byte j:
    // column 2j in the low nibble, 2j+1 in the high one). Column c decodes to the int8 grid value
    //     L = clamp(round(codebook[code] * e4m3(sr[c / 16])), -127, 127)      (float32, half to even)
    // times d, exactly as ComfyUI's kernels do; the weight is usually stored in the Hadamard basis
    // (see ggml_pyqwen_hadamard). Id 0 is the uniform code (code - 8); other ids come from
    // ggml_pyqwen_w4a8_codebook() and live in a process-wide table, because a block has no room for
    // a 16-entry codebook and ggml's kernels only see block data. A NaN scale decodes to NaN.
    // Matrix products quantize the activations to Q8_0, as for Q8_0 weights.
    enum { GGML_PYQWEN_W4A8_BLOCK = 256 };

    // Id of a 16-entry codebook (registered on first use, equal tables share an id), or -1 if an
    // entry is not finite or the table of codebooks is full.
    GGML_API int32_t ggml_pyqwen_w4a8_codebook(const float codebook[16]);
    // Writes codebook id `id` into every block of `data` (n_blocks blocks).
    GGML_API void    ggml_pyqwen_w4a8_set_codebook(void * data, int64_t n_blocks, int32_t id);
    // k values (whole blocks) as GGML_TYPE_Q8_0 blocks: the same int8 grid values, and the channel
    // scale d in fp16, so each value is exactly L * fp16(d). A 32-column block with a NaN scale in
    // either of its 16-column groups (or an unknown codebook) decodes to NaN. For backends without
    // a pq_w4a8 kernel: 8.5 bits a weight instead of 4.75.
    GGML_API void    ggml_pyqwen_w4a8_to_q8_0(const void * src, void * dst, int64_t k);

    // x -> x·H on each run of n consecutive elements of every row, where H = (⊗ H4) / sqrt(n) is
    // the symmetric orthogonal "regular" Hadamard matrix of ComfyUI's ConvRot (n a power of 4,
    // H4 = [[1,1,1,-1],[1,1,-1,1],[1,-1,1,1],[-1,1,1,1]]). A weight W stored as W_rot = W·H (per n
    // columns) gives W·x = W_rot·(H·x), so the rotation goes to the activations.
    //   a       F32 [ne0, ...], ne0 a multiple of n, rows contiguous
    //   result  F32, the shape of a, contiguous
    GGML_API struct ggml_tensor * ggml_pyqwen_hadamard(
            struct ggml_context * ctx,
            struct ggml_tensor  * a,
            int                   n);

    // The input side of a Gated DeltaNet layer for n tokens of one sequence (the decode and draft-verify
    // passes), ready for ggml_gated_delta_net: the causal conv1d over [conv_state | qkv] (which also
    // advances conv_state in place, token by token), SiLU, the L2 norms of q and k (x / sqrt(sum(x^2) +
    // eps) per head and token), the log decay g = softplus(alpha + dt_bias) * a and beta = sigmoid(beta).
    // One kernel where the unfused graph takes six or more. Rows (dim 1) may be strided, e.g. views of
    // one stacked projection's output.
    //   qkv        F32 [(2*n_k_heads + n_v_heads) * S, n] q heads | k heads | v heads per token
    //   beta       F32 [n_v_heads, n]                   the beta projection, before the sigmoid
    //   alpha      F32 [n_v_heads, n]                   the decay projection, before the bias
    //   conv_state F32 [K - 1, channels]                the previous K - 1 inputs per channel; updated
    //   conv_w     F32 [K, channels]
    //   dt_bias, a F32 [n_v_heads]                      a = -exp(A_log)
    //   result     F32 [(channels + 2 * n_v_heads) * n] q | k | v of every token (channels each, after
    //                                                   conv, SiLU, norms), then g [n_v_heads, n], then beta
    GGML_API struct ggml_tensor * ggml_pyqwen_deltanet_prep(
            struct ggml_context * ctx,
            struct ggml_tensor  * qkv,
            struct ggml_tensor  * beta,
            struct ggml_tensor  * alpha,
            struct ggml_tensor  * conv_state,
            struct ggml_tensor  * conv_w,
            struct ggml_tensor  * dt_bias,
            struct ggml_tensor  * a,
            int                   n_k_heads,
            float                 eps);
    // Its CUDA kernel runs a thread a channel with the conv state in registers: heads of up to this many
    // channels (S) and conv kernels up to this wide (K); the CUDA backend reports larger ones unsupported.
    enum { GGML_PYQWEN_DELTANET_PREP_CUDA_MAX_HEAD = 512, GGML_PYQWEN_DELTANET_PREP_CUDA_MAX_K = 8 };

#ifdef __cplusplus
}
#endif
