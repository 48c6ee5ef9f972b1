// CUDA kernel of GGML_OP_PYQWEN_DELTANET_PREP: CTA h < n_k_heads takes the q and k channels of k head
// h and L2-normalizes both (one block reduction); CTA n_k_heads + v takes the channels of v head v and
// writes g[v] and beta[v]. Thread t takes channels t, t + blockDim.x, ... of its head, so every
// conv_state row is read and shifted by exactly one thread. The per-element steps are shared with the
// CPU kernel (pyqwen-deltanet-step.h).
#include "pyqwen-deltanet.cuh"
#include "ggml-pyqwen.h"
#include "pyqwen-deltanet-step.h"

static __global__ void pyqwen_deltanet_prep_kernel(
        const float * qkv, const float * beta, const float * alpha, float * state, const float * w,
        const float * bias, const float * a, float * out, const int hk, const int hv, const int S, const int k1, const float eps) {
    const int h = blockIdx.x, t = threadIdx.x;
    const int64_t channels = (int64_t) (2*hk + hv)*S;
    if (h >= hk) {
        const int v = h - hk;
        for (int i = t; i < S; i += blockDim.x) {
            const int64_t ch = (int64_t) (2*hk + v)*S + i;
            out[ch] = pqd_conv_silu(state + ch*k1, w + ch*(k1 + 1), k1, qkv[ch]);
        }
        if (t == 0) {
            out[channels + v]      = pqd_decay(alpha[v], bias[v], a[v]);
            out[channels + hv + v] = pqd_sigmoid(beta[v]);
        }
        return;
    }

    // conv + SiLU of the q and k channels (each thread keeps what it wrote), then one block reduction
    float * q = out + (int64_t) h*S, * k = out + (int64_t) (hk + h)*S;
    float2 ss = make_float2(0.0f, 0.0f);
    for (int i = t; i < S; i += blockDim.x) {
        const int64_t cq = (int64_t) h*S + i, ck = (int64_t) (hk + h)*S + i;
        q[i] = pqd_conv_silu(state + cq*k1, w + cq*(k1 + 1), k1, qkv[cq]);
        k[i] = pqd_conv_silu(state + ck*k1, w + ck*(k1 + 1), k1, qkv[ck]);
        ss.x += q[i]*q[i];
        ss.y += k[i]*k[i];
    }
    __shared__ float2 partial[32];
    ss = warp_reduce_sum(ss);
    if (t % WARP_SIZE == 0) {
        partial[t / WARP_SIZE] = ss;
    }
    __syncthreads();
    float2 sum = make_float2(0.0f, 0.0f);
    for (int i = 0; i < (int) blockDim.x / WARP_SIZE; ++i) {
        sum.x += partial[i].x;
        sum.y += partial[i].y;
    }
    const float sq = rsqrtf(sum.x + eps), sk = rsqrtf(sum.y + eps);
    for (int i = t; i < S; i += blockDim.x) {
        q[i] *= sq;
        k[i] *= sk;
    }
}

static int pqd_head_size(const ggml_tensor * op) {
    const int hk = ggml_get_op_params_i32(op, 0);
    return (int) (op->src[0]->ne[0] / (2*hk + op->src[5]->ne[0]));
}

void ggml_cuda_op_pyqwen_deltanet_prep(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const int hk = ggml_get_op_params_i32(dst, 0), hv = (int) dst->src[5]->ne[0];
    const int S  = pqd_head_size(dst), k1 = (int) dst->src[3]->ne[0];
    const float eps = ggml_get_op_params_f32(dst, 1);
    const int threads = std::min(1024, (S + WARP_SIZE - 1)/WARP_SIZE*WARP_SIZE);
    pyqwen_deltanet_prep_kernel<<<hk + hv, threads, 0, ctx.stream()>>>(
        (const float *) dst->src[0]->data, (const float *) dst->src[1]->data, (const float *) dst->src[2]->data,
        (float *) dst->src[3]->data, (const float *) dst->src[4]->data, (const float *) dst->src[5]->data,
        (const float *) dst->src[6]->data, (float *) dst->data, hk, hv, S, k1, eps);
    CUDA_CHECK(cudaGetLastError());
}
