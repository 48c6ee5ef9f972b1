// pyqwen additions to ggml: ops that are not upstream, registered by ggml-patches/*.patch.
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
    // If the best logit is +-inf the row is decided greedily. Only the CPU backend implements the op;
    // the scheduler places it there and copies the logits to the host.
    GGML_API struct ggml_tensor * ggml_pyqwen_sample(
            struct ggml_context * ctx,
            struct ggml_tensor  * logits,
            struct ggml_tensor  * params,
            struct ggml_tensor  * history);

#ifdef __cplusplus
}
#endif
