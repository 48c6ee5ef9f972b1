// The per-element steps of GGML_OP_PYQWEN_DELTANET_PREP (include/ggml-pyqwen.h), one definition for
// its CPU kernel (ggml-cpu/pyqwen-deltanet-cpu.c) and its CUDA kernel (ggml-cuda/pyqwen-deltanet.cu),
// with the arithmetic of the unfused graph: ssm_conv's sum order, ggml's SiLU, softplus and sigmoid.
#pragma once

#include <math.h>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define PQD_FN static __device__ __forceinline__
#else
#define PQD_FN static inline
#endif

// conv over [state | x] for one channel (k1 = kernel - 1 state values), then SiLU; shifts x into the state.
PQD_FN float pqd_conv_silu(float * state, const float * w, const int k1, const float x) {
    float sum = 0.0f;
    for (int j = 0; j < k1; ++j) {
        sum += state[j] * w[j];
    }
    sum += x * w[k1];
    for (int j = 0; j + 1 < k1; ++j) {
        state[j] = state[j + 1];
    }
    state[k1 - 1] = x;
    return sum / (1.0f + expf(-sum));
}

// the log decay g = softplus(alpha + dt_bias) * a
PQD_FN float pqd_decay(const float alpha, const float dt_bias, const float a) {
    const float x = alpha + dt_bias;
    return (x > 20.0f ? x : logf(1.0f + expf(x))) * a;
}

PQD_FN float pqd_sigmoid(const float x) {
    return 1.0f / (1.0f + expf(-x));
}
