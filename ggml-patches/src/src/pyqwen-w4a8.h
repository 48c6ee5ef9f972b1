// GGML_TYPE_PQ_W4A8 (include/ggml-pyqwen.h): block layout and the functions ggml.c and the CPU
// backend register for the type.
#pragma once

#include "ggml.h"
#include "ggml-pyqwen.h"

#include <assert.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    float    d;                                 // channel scale of the row
    uint32_t cb;                                // codebook id, 0: uniform (code - 8)
    uint8_t  sr[GGML_PYQWEN_W4A8_BLOCK / 16];   // e4m3fn relative scale of each 16 columns
    uint8_t  qs[GGML_PYQWEN_W4A8_BLOCK / 2];    // codes, two per byte (even column low nibble)
} block_pq_w4a8;
static_assert(sizeof(block_pq_w4a8) == 2 * sizeof(uint32_t) + GGML_PYQWEN_W4A8_BLOCK / 16 + GGML_PYQWEN_W4A8_BLOCK / 2,
              "wrong pq_w4a8 block size/padding");

// The int8 grid values of codebook `id`: levels[s][code] for the e4m3fn scale byte s, or NULL for
// an id that was never registered. Rows of NaN scales are all 0 (see ggml_pyqwen_w4a8_nan_scale).
GGML_API const int8_t (*ggml_pyqwen_w4a8_levels(uint32_t id))[16];

static inline int ggml_pyqwen_w4a8_nan_scale(uint8_t s) {
    return (s & 0x7F) == 0x7F;   // e4m3fn has no infinities; these two bytes are its NaNs
}

GGML_API void dequantize_row_pq_w4a8(const block_pq_w4a8 * GGML_RESTRICT x, float * GGML_RESTRICT y, int64_t k);

#ifdef __cplusplus
}
#endif
