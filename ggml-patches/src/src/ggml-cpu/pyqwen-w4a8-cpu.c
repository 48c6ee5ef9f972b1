// CPU dot product of a GGML_TYPE_PQ_W4A8 row with a Q8_0 row. Each 32 weight columns (two scale
// groups) meet one Q8_0 block: the codes are decoded to their int8 grid values with the
// codebook's level table (one 16-entry table per scale group, a byte shuffle on AVX2), multiplied
// with the activation bytes in integers and scaled by d_weight * d_activation.
#include "pyqwen-w4a8-cpu.h"

#define GGML_COMMON_DECL_C
#include "ggml-common.h"

#include "ggml-cpu-impl.h"
#include "simd-mappings.h"
#include "pyqwen-w4a8.h"

#include <assert.h>
#include <math.h>
#include <stdbool.h>

#if defined(__AVX2__)
#include <immintrin.h>

// sum over 32 columns of L * q as 8 int32 lanes, L from the two level tables
static inline __m256i pqw_dot32(const uint8_t * qs, const int8_t * t0, const int8_t * t1, const int8_t * q) {
    const __m128i codes = _mm_loadu_si128((const __m128i *) qs);
    const __m128i mask  = _mm_set1_epi8(0x0F);
    const __m128i lo    = _mm_and_si128(codes, mask);
    const __m128i hi    = _mm_and_si128(_mm_srli_epi16(codes, 4), mask);
    // byte j holds columns 2j (low nibble) and 2j + 1: interleaving restores column order
    const __m128i w0 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *) t0), _mm_unpacklo_epi8(lo, hi));
    const __m128i w1 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *) t1), _mm_unpackhi_epi8(lo, hi));
    const __m256i w  = _mm256_set_m128i(w1, w0);
    const __m256i y  = _mm256_loadu_si256((const __m256i *) q);
    // |w| * sign(w)·y: maddubs needs an unsigned operand; |w| <= 127 keeps the pair sums in int16
    const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(y, w));
    return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
}

static inline float pqw_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

void ggml_vec_dot_pq_w4a8_q8_0(int n, float * GGML_RESTRICT s, size_t bs, const void * GGML_RESTRICT vx, size_t bx,
                               const void * GGML_RESTRICT vy, size_t by, int nrc) {
    const int QK = GGML_PYQWEN_W4A8_BLOCK;
    assert(n % QK == 0);
    assert(nrc == 1);
    GGML_UNUSED(bs);
    GGML_UNUSED(bx);
    GGML_UNUSED(by);
    GGML_UNUSED(nrc);

    const block_pq_w4a8 * GGML_RESTRICT x = vx;
    const block_q8_0    * GGML_RESTRICT y = vy;
    const int nb = n / QK;
    const int per = QK / QK8_0;   // Q8_0 blocks per weight block

    bool bad = false;   // a NaN scale or an unknown codebook id
#if defined(__AVX2__)
    __m256 acc = _mm256_setzero_ps();
#else
    float sumf = 0.0f;
#endif
    for (int i = 0; i < nb; ++i) {
        const int8_t (*levels)[16] = ggml_pyqwen_w4a8_levels(x[i].cb);
        for (int g = 0; g < QK / 16; ++g) {
            bad |= ggml_pyqwen_w4a8_nan_scale(x[i].sr[g]);
        }
        if (!levels || bad) {
            bad = true;
            break;
        }
        for (int j = 0; j < per; ++j) {
            const block_q8_0 * yb = &y[i * per + j];
            const float d = x[i].d * GGML_CPU_FP16_TO_FP32(yb->d);
            const int8_t * t0 = levels[x[i].sr[2 * j]];
            const int8_t * t1 = levels[x[i].sr[2 * j + 1]];
            const uint8_t * qs = x[i].qs + 16 * j;
#if defined(__AVX2__)
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(pqw_dot32(qs, t0, t1, yb->qs)), acc);
#else
            int sumi = 0;
            for (int k = 0; k < 8; ++k) {
                sumi += t0[qs[k] & 0xF] * yb->qs[2 * k]      + t0[qs[k] >> 4] * yb->qs[2 * k + 1];
                sumi += t1[qs[8 + k] & 0xF] * yb->qs[16 + 2 * k] + t1[qs[8 + k] >> 4] * yb->qs[16 + 2 * k + 1];
            }
            sumf += d * (float) sumi;
#endif
        }
    }
#if defined(__AVX2__)
    const float sumf = pqw_hsum(acc);
#endif
    *s = bad ? NAN : sumf;
}
