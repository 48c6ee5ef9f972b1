// GGML_TYPE_PQ_W4A8 (include/ggml-pyqwen.h): the process-wide codebook table, dequantization, and the
// expansion to Q8_0 for backends without a kernel for the type.
//
// Each codebook entry keeps, besides its 16 values, the int8 grid value of every (scale byte,
// code) pair, so kernels decode a weight with one table lookup and the rounding is done once, here.
#define GGML_COMMON_DECL_C
#include "ggml-common.h"

#include "pyqwen-w4a8.h"

#include "ggml-impl.h"
#include "ggml-threading.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define PQ_W4A8_MAX_CODEBOOKS (1 << 16)

struct pq_w4a8_codebook {
    float  values[16];
    int8_t levels[256][16];
};

// entries are written once, under ggml's critical section, and never freed (they are tiny and a
// weight may outlive any owner); slot 0 is the uniform code, made on first use
static _Atomic(struct pq_w4a8_codebook *) pq_codebooks[PQ_W4A8_MAX_CODEBOOKS];
static int32_t pq_n_codebooks = 1;

static float pq_e4m3fn_to_fp32(uint8_t b) {
    const int exp = (b >> 3) & 0xF, man = b & 0x7;
    if (ggml_pyqwen_w4a8_nan_scale(b)) {
        return NAN;
    }
    const float v = exp == 0 ? ldexpf((float) man, -9) : ldexpf(1.0f + (float) man / 8.0f, exp - 7);
    return b & 0x80 ? -v : v;
}

static struct pq_w4a8_codebook * pq_codebook_new(const float values[16]) {
    struct pq_w4a8_codebook * cb = malloc(sizeof(*cb));
    if (!cb) {
        return NULL;
    }
    memcpy(cb->values, values, sizeof(cb->values));
    for (int s = 0; s < 256; ++s) {
        const float scale = pq_e4m3fn_to_fp32((uint8_t) s);
        for (int q = 0; q < 16; ++q) {
            // ComfyUI: round(codebook[q] * s_rel) in float32, half to even, then clamp
            const float v = values[q] * scale;
            cb->levels[s][q] = isnan(v) ? 0 : (int8_t) nearbyintf(fminf(fmaxf(v, -127.0f), 127.0f));
        }
    }
    return cb;
}

int32_t ggml_pyqwen_w4a8_codebook(const float codebook[16]) {
    for (int q = 0; q < 16; ++q) {
        if (!isfinite(codebook[q])) {
            return -1;
        }
    }
    int32_t id = -1;
    ggml_critical_section_start();
    for (int32_t i = 1; i < pq_n_codebooks; ++i) {
        const struct pq_w4a8_codebook * cb = atomic_load(&pq_codebooks[i]);
        if (memcmp(cb->values, codebook, sizeof(cb->values)) == 0) {
            id = i;
            break;
        }
    }
    if (id < 0 && pq_n_codebooks < PQ_W4A8_MAX_CODEBOOKS) {
        struct pq_w4a8_codebook * cb = pq_codebook_new(codebook);
        if (cb) {
            id = pq_n_codebooks++;
            atomic_store(&pq_codebooks[id], cb);
        }
    }
    ggml_critical_section_end();
    return id;
}

const int8_t (*ggml_pyqwen_w4a8_levels(uint32_t id))[16] {
    if (id >= PQ_W4A8_MAX_CODEBOOKS) {
        return NULL;
    }
    struct pq_w4a8_codebook * cb = atomic_load(&pq_codebooks[id]);
    if (!cb && id == 0) {
        ggml_critical_section_start();
        cb = atomic_load(&pq_codebooks[0]);
        if (!cb) {
            float uniform[16];
            for (int q = 0; q < 16; ++q) {
                uniform[q] = (float) (q - 8);
            }
            cb = pq_codebook_new(uniform);
            atomic_store(&pq_codebooks[0], cb);
        }
        ggml_critical_section_end();
    }
    return cb ? (const int8_t (*)[16]) cb->levels : NULL;
}

void ggml_pyqwen_w4a8_set_codebook(void * data, int64_t n_blocks, int32_t id) {
    block_pq_w4a8 * x = data;
    for (int64_t i = 0; i < n_blocks; ++i) {
        x[i].cb = (uint32_t) id;
    }
}

void dequantize_row_pq_w4a8(const block_pq_w4a8 * GGML_RESTRICT x, float * GGML_RESTRICT y, int64_t k) {
    const int QK = GGML_PYQWEN_W4A8_BLOCK;
    assert(k % QK == 0);
    for (int64_t i = 0; i < k / QK; ++i, y += QK) {
        const int8_t (*levels)[16] = ggml_pyqwen_w4a8_levels(x[i].cb);
        for (int g = 0; g < QK / 16; ++g) {
            const uint8_t s = x[i].sr[g];
            if (!levels || ggml_pyqwen_w4a8_nan_scale(s)) {
                for (int j = 0; j < 16; ++j) {
                    y[16 * g + j] = NAN;
                }
                continue;
            }
            for (int j = 0; j < 8; ++j) {
                const uint8_t b = x[i].qs[8 * g + j];
                y[16 * g + 2 * j]     = (float) levels[s][b & 0xF] * x[i].d;
                y[16 * g + 2 * j + 1] = (float) levels[s][b >> 4]  * x[i].d;
            }
        }
    }
}

void ggml_pyqwen_w4a8_to_q8_0(const void * GGML_RESTRICT src, void * GGML_RESTRICT dst, int64_t k) {
    const int QK = GGML_PYQWEN_W4A8_BLOCK;
    static_assert(GGML_PYQWEN_W4A8_BLOCK % QK8_0 == 0 && QK8_0 % 16 == 0, "a Q8_0 block spans whole 16-column scale groups");
    assert(k % QK == 0);
    const block_pq_w4a8 * x = src;
    block_q8_0 * y = dst;
    for (int64_t i = 0; i < k / QK; ++i) {
        const int8_t (*levels)[16] = ggml_pyqwen_w4a8_levels(x[i].cb);
        for (int b = 0; b < QK / QK8_0; ++b, ++y) {
            bool nan = !levels;
            for (int g = b * (QK8_0 / 16); g < (b + 1) * (QK8_0 / 16); ++g) {
                nan = nan || ggml_pyqwen_w4a8_nan_scale(x[i].sr[g]);
            }
            y->d = GGML_FP32_TO_FP16(nan ? NAN : x[i].d);
            for (int j = 0; j < QK8_0 / 2; ++j) {
                const int c = b * QK8_0 + 2 * j;  // the columns of byte c / 2: c and c + 1, in one scale group
                const uint8_t q = x[i].qs[c / 2], s = x[i].sr[c / 16];
                y->qs[2 * j]     = nan ? 0 : levels[s][q & 0xF];
                y->qs[2 * j + 1] = nan ? 0 : levels[s][q >> 4];
            }
        }
    }
}
