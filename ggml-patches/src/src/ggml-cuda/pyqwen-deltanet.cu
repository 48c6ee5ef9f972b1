// CUDA kernel of GGML_OP_PYQWEN_DELTANET_PREP: CTA h < n_k_heads takes the q and k channels of k head
// h and L2-normalizes both (one block reduction per token); CTA n_k_heads + v takes the channels of v
// head v and writes g and beta of v. Thread t takes channels t, t + blockDim.x, ... of its head for
// every token in order, so every conv_state row is read and shifted by exactly one thread. The
// per-element steps are shared with the CPU kernel (pyqwen-deltanet-step.h).
#include "pyqwen-deltanet.cuh"
#include "ggml-pyqwen.h"
#include "pyqwen-deltanet-step.h"

// Row strides sq, sb, sa (floats) of qkv, beta and alpha; out as in ggml_pyqwen_deltanet_prep.
static __global__ void pyqwen_deltanet_prep_kernel(
        const float * qkv, const float * beta, const float * alpha, float * state, const float * w,
        const float * bias, const float * a, float * out, const int64_t sq, const int64_t sb, const int64_t sa,
        const int n, const int hk, const int hv, const int S, const int k1, const float eps) {
    const int h = blockIdx.x, t = threadIdx.x;
    const int64_t channels = (int64_t) (2*hk + hv)*S;
    float * g = out + channels*n, * b = g + (int64_t) hv*n;
    if (h >= hk) {
        const int v = h - hk;
        for (int tok = 0; tok < n; ++tok) {
            for (int i = t; i < S; i += blockDim.x) {
                const int64_t ch = (int64_t) (2*hk + v)*S + i;
                out[tok*channels + ch] = pqd_conv_silu(state + ch*k1, w + ch*(k1 + 1), k1, qkv[tok*sq + ch]);
            }
            if (t == 0) {
                g[tok*hv + v] = pqd_decay(alpha[tok*sa + v], bias[v], a[v]);
                b[tok*hv + v] = pqd_sigmoid(beta[tok*sb + v]);
            }
        }
        return;
    }

    __shared__ float2 partial[32];
    for (int tok = 0; tok < n; ++tok) {
        // conv + SiLU of the q and k channels (each thread keeps what it wrote), then one block reduction
        float * q = out + tok*channels + (int64_t) h*S, * k = out + tok*channels + (int64_t) (hk + h)*S;
        const float * x = qkv + tok*sq;
        float2 ss = make_float2(0.0f, 0.0f);
        for (int i = t; i < S; i += blockDim.x) {
            const int64_t cq = (int64_t) h*S + i, ck = (int64_t) (hk + h)*S + i;
            q[i] = pqd_conv_silu(state + cq*k1, w + cq*(k1 + 1), k1, x[cq]);
            k[i] = pqd_conv_silu(state + ck*k1, w + ck*(k1 + 1), k1, x[ck]);
            ss.x += q[i]*q[i];
            ss.y += k[i]*k[i];
        }
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
        const float sq_inv = rsqrtf(sum.x + eps), sk_inv = rsqrtf(sum.y + eps);
        for (int i = t; i < S; i += blockDim.x) {
            q[i] *= sq_inv;
            k[i] *= sk_inv;
        }
        __syncthreads(); // partial is rewritten for the next token
    }
}

static int pqd_head_size(const ggml_tensor * op) {
    const int hk = ggml_get_op_params_i32(op, 0);
    return (int) (op->src[0]->ne[0] / (2*hk + op->src[5]->ne[0]));
}

void ggml_cuda_op_pyqwen_deltanet_prep(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * qkv = dst->src[0], * beta = dst->src[1], * alpha = dst->src[2];
    const int hk = ggml_get_op_params_i32(dst, 0), hv = (int) dst->src[5]->ne[0];
    const int S  = pqd_head_size(dst), k1 = (int) dst->src[3]->ne[0];
    const float eps = ggml_get_op_params_f32(dst, 1);
    const int threads = std::min(1024, (S + WARP_SIZE - 1)/WARP_SIZE*WARP_SIZE);
    pyqwen_deltanet_prep_kernel<<<hk + hv, threads, 0, ctx.stream()>>>(
        (const float *) qkv->data, (const float *) beta->data, (const float *) alpha->data,
        (float *) dst->src[3]->data, (const float *) dst->src[4]->data, (const float *) dst->src[5]->data,
        (const float *) dst->src[6]->data, (float *) dst->data,
        qkv->nb[1]/sizeof(float), beta->nb[1]/sizeof(float), alpha->nb[1]/sizeof(float), (int) qkv->ne[1], hk, hv, S, k1, eps);
    CUDA_CHECK(cudaGetLastError());
}
