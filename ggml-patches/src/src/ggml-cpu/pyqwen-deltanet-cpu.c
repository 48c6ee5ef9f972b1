// CPU kernel of GGML_OP_PYQWEN_DELTANET_PREP. The work is split in heads: k head h takes the
// channels of q head h and k head h, v head h its v channels, g[h] and beta[h], for every token in
// order; every channel, and so every row of conv_state, belongs to exactly one head, which keeps the
// in-place state update free of races between threads. The per-element steps are
// pyqwen-deltanet-step.h's; the norm's sum of squares is in double, as in ggml's CPU rms_norm.
#include "pyqwen-deltanet-cpu.h"

#include "ggml-cpu-impl.h"
#include "ggml-impl.h"
#include "pyqwen-deltanet-step.h"

#include <math.h>

static void pqd_conv_head(float * out, const float * qkv, float * state, const float * w, int64_t ch0, int64_t n, int k1) {
    for (int64_t i = 0; i < n; ++i) {
        const int64_t ch = ch0 + i;
        out[ch] = pqd_conv_silu(state + ch * k1, w + ch * (k1 + 1), k1, qkv[ch]);
    }
}

static void pqd_l2_norm(float * x, int64_t n, float eps) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        sum += (double) x[i] * x[i];
    }
    const float scale = 1.0f / sqrtf((float) sum + eps);
    for (int64_t i = 0; i < n; ++i) {
        x[i] *= scale;
    }
}

void ggml_compute_forward_pyqwen_deltanet_prep(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const struct ggml_tensor * src_qkv = dst->src[0], * src_beta = dst->src[1], * src_alpha = dst->src[2];
    float       * state = (float *) dst->src[3]->data;
    const float * w     = (const float *) dst->src[4]->data;
    const float * bias  = (const float *) dst->src[5]->data;
    const float * a     = (const float *) dst->src[6]->data;
    float       * out   = (float *) dst->data;

    const int     hk = ggml_get_op_params_i32(dst, 0);
    const float   eps = ggml_get_op_params_f32(dst, 1);
    const int64_t channels = src_qkv->ne[0], n = src_qkv->ne[1], hv = dst->src[5]->ne[0];
    const int64_t S = channels / (2 * hk + hv);
    const int     k1 = (int) dst->src[3]->ne[0];
    float * g = out + channels * n, * beta = g + hv * n;

    for (int64_t h = params->ith; h < hk + hv; h += params->nth) {
        for (int64_t t = 0; t < n; ++t) {
            const float * qkv = (const float *) ((const char *) src_qkv->data + t * src_qkv->nb[1]);
            float * o = out + t * channels;
            if (h < hk) {
                pqd_conv_head(o, qkv, state, w, h * S, S, k1);
                pqd_conv_head(o, qkv, state, w, (hk + h) * S, S, k1);
                pqd_l2_norm(o + h * S, S, eps);
                pqd_l2_norm(o + (hk + h) * S, S, eps);
            } else {
                const int64_t v = h - hk;
                const float alpha_v = *(const float *) ((const char *) src_alpha->data + t * src_alpha->nb[1] + v * sizeof(float));
                const float beta_v  = *(const float *) ((const char *) src_beta->data  + t * src_beta->nb[1]  + v * sizeof(float));
                pqd_conv_head(o, qkv, state, w, (2 * hk + v) * S, S, k1);
                g[t * hv + v]    = pqd_decay(alpha_v, bias[v], a[v]);
                beta[t * hv + v] = pqd_sigmoid(beta_v);
            }
        }
    }
}
