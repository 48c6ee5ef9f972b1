// CPU kernel of GGML_OP_PYQWEN_HADAMARD: each thread takes a contiguous range of rows and
// transforms every run of n elements in place in dst, one 4-point butterfly stage per base-4
// digit of the index (H is the Kronecker power of H4), then scales by 1/sqrt(n), a power of two.
#include "pyqwen-hadamard-cpu.h"

#include "ggml-cpu-impl.h"
#include "ggml-impl.h"

#include <string.h>

// x -> (⊗ H4)·x on n = 4^k floats. H4·(a,b,c,d) = s - 2·(d,c,b,a) with s = a + b + c + d.
static void pqh_transform(float * x, int n) {
    for (int h = 1; h < n; h *= 4) {
        for (int i = 0; i < n; i += 4 * h) {
            for (int j = i; j < i + h; ++j) {
                const float a = x[j], b = x[j + h], c = x[j + 2 * h], d = x[j + 3 * h];
                const float s = (a + b) + (c + d);
                x[j]         = s - 2.0f * d;
                x[j + h]     = s - 2.0f * c;
                x[j + 2 * h] = s - 2.0f * b;
                x[j + 3 * h] = s - 2.0f * a;
            }
        }
    }
}

void ggml_compute_forward_pyqwen_hadamard(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const struct ggml_tensor * src = dst->src[0];
    const int n = ggml_get_op_params_i32(dst, 0);
    int log4 = 0;
    while ((1 << (2 * log4)) < n) {
        ++log4;
    }
    const float scale = 1.0f / (float) (1 << log4);   // 1/sqrt(n), exact

    const int64_t ne0 = src->ne[0], ne1 = src->ne[1], ne2 = src->ne[2];
    const int64_t n_rows = ggml_nrows(src);
    const int64_t r0 = n_rows * params->ith / params->nth;
    const int64_t r1 = n_rows * (params->ith + 1) / params->nth;
    for (int64_t r = r0; r < r1; ++r) {
        const int64_t i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / (ne1 * ne2);
        const float * x = (const float *) ((const char *) src->data + i1 * src->nb[1] + i2 * src->nb[2] + i3 * src->nb[3]);
        float * y = (float *) ((char *) dst->data + i1 * dst->nb[1] + i2 * dst->nb[2] + i3 * dst->nb[3]);
        memcpy(y, x, sizeof(float) * (size_t) ne0);
        for (int64_t g = 0; g < ne0; g += n) {
            pqh_transform(y + g, n);
        }
        for (int64_t i = 0; i < ne0; ++i) {
            y[i] *= scale;
        }
    }
}
