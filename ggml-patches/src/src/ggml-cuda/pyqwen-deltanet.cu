// CUDA kernel of GGML_OP_PYQWEN_DELTANET_PREP: CTA h < n_k_heads takes the q and k channels of k head
// h and L2-normalizes both; CTA n_k_heads + v takes the channels of v head v and writes g and beta of v.
// Thread t takes channel t of its head(s): it loads that channel's conv state and weights into
// registers once, runs the conv over the pass's tokens there and stores the state back once. (Shifting
// the state in global memory made each token wait for the previous token's store: an 8-token pass cost
// 3.1x a 1-token one, bench/RESULTS.md.) Tokens go in groups of PQD_GROUP, whose inputs are loaded
// before the first conv step and whose q/k norms share one block reduction. The per-element steps are
// shared with the CPU kernel (pyqwen-deltanet-step.h).
#include "pyqwen-deltanet.cuh"
#include "ggml-pyqwen.h"
#include "pyqwen-deltanet-step.h"

#define PQD_GROUP    8
#define PQD_MAX_K1   (GGML_PYQWEN_DELTANET_PREP_CUDA_MAX_K - 1) // Qwen3.5 and Qwen3-Next: 3
#define PQD_MAX_HEAD GGML_PYQWEN_DELTANET_PREP_CUDA_MAX_HEAD     // one thread a channel (Qwen3.5: 128)

// The conv + SiLU of one channel for the nt tokens of a group (its inputs x[tok*sx]); st and w in registers.
template <int K1>
static __device__ __forceinline__ void pqd_conv_group(float (&st)[K1], const float (&w)[K1 + 1], const float * x,
                                                      const int64_t sx, const int nt, float (&y)[PQD_GROUP]) {
    float in[PQD_GROUP];
#pragma unroll
    for (int j = 0; j < PQD_GROUP; ++j) {
        in[j] = j < nt ? x[j*sx] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < PQD_GROUP; ++j) {
        if (j < nt) {
            y[j] = pqd_conv_silu(st, w, K1, in[j]);
        }
    }
}

// Row strides sq, sb, sa (floats) of qkv, beta and alpha; out as in ggml_pyqwen_deltanet_prep.
template <int K1>
static __global__ void __launch_bounds__(PQD_MAX_HEAD)
pyqwen_deltanet_prep_kernel(
        const float * qkv, const float * beta, const float * alpha, float * state, const float * conv_w,
        const float * bias, const float * a, float * out, const int64_t sq, const int64_t sb, const int64_t sa,
        const int n, const int hk, const int hv, const int S, const float eps) {
    const int h = blockIdx.x, t = threadIdx.x;
    const bool is_v = h >= hk, active = t < S;
    const int64_t channels = (int64_t) (2*hk + hv)*S;
    float * g = out + channels*n, * b = g + (int64_t) hv*n;

    // a v CTA's channel, or a k CTA's q and k channels
    const int nch = is_v ? 1 : 2;
    const int64_t ch[2] = { (int64_t) (is_v ? 2*hk + (h - hk) : h)*S + t, (int64_t) (hk + h)*S + t };
    float st[2][K1], w[2][K1 + 1];
    if (active) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            if (c < nch) {
#pragma unroll
                for (int j = 0; j < K1; ++j) {
                    st[c][j] = state[ch[c]*K1 + j];
                }
#pragma unroll
                for (int j = 0; j <= K1; ++j) {
                    w[c][j] = conv_w[ch[c]*(K1 + 1) + j];
                }
            }
        }
    }

    __shared__ float2 partial[PQD_GROUP][32];
    const int nwarps = (int) blockDim.x / WARP_SIZE;
    for (int tok0 = 0; tok0 < n; tok0 += PQD_GROUP) {
        const int nt = min(PQD_GROUP, n - tok0);
        float y[2][PQD_GROUP] = {}; // zeros in inactive threads: they add nothing to the norms (and UB otherwise)
        if (active) {
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                if (c < nch) {
                    pqd_conv_group<K1>(st[c], w[c], qkv + tok0*sq + ch[c], sq, nt, y[c]);
                }
            }
        }
        if (is_v) {
            if (active) {
                for (int j = 0; j < nt; ++j) {
                    out[(tok0 + j)*channels + ch[0]] = y[0][j];
                }
            }
            if (t < nt) {
                const int tok = tok0 + t, v = h - hk;
                g[tok*hv + v] = pqd_decay(alpha[tok*sa + v], bias[v], a[v]);
                b[tok*hv + v] = pqd_sigmoid(beta[tok*sb + v]);
            }
            continue;
        }
        // the q and k norms of the group's tokens: one block reduction
#pragma unroll
        for (int j = 0; j < PQD_GROUP; ++j) {
            if (j < nt) { // uniform
                const float2 ss = warp_reduce_sum(make_float2(y[0][j]*y[0][j], y[1][j]*y[1][j]));
                if (t % WARP_SIZE == 0) {
                    partial[j][t / WARP_SIZE] = ss;
                }
            }
        }
        __syncthreads();
        if (active) {
#pragma unroll
            for (int j = 0; j < PQD_GROUP; ++j) {
                if (j < nt) {
                    float2 sum = make_float2(0.0f, 0.0f);
                    for (int i = 0; i < nwarps; ++i) {
                        sum.x += partial[j][i].x;
                        sum.y += partial[j][i].y;
                    }
                    out[(tok0 + j)*channels + ch[0]] = y[0][j]*rsqrtf(sum.x + eps);
                    out[(tok0 + j)*channels + ch[1]] = y[1][j]*rsqrtf(sum.y + eps);
                }
            }
        }
        __syncthreads(); // partial is rewritten by the next group
    }

    if (active) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            if (c < nch) {
#pragma unroll
                for (int j = 0; j < K1; ++j) {
                    state[ch[c]*K1 + j] = st[c][j];
                }
            }
        }
    }
}

static int pqd_head_size(const ggml_tensor * op) {
    const int hk = ggml_get_op_params_i32(op, 0);
    return (int) (op->src[0]->ne[0] / (2*hk + op->src[5]->ne[0]));
}

bool ggml_cuda_pyqwen_deltanet_prep_supported(const ggml_tensor * op) {
    // one thread a channel; the conv state in registers
    return pqd_head_size(op) <= PQD_MAX_HEAD && op->src[3]->ne[0] <= PQD_MAX_K1;
}

// Calls f(std::integral_constant<int, k1>()) for 1 <= k1 <= PQD_MAX_K1.
template <typename F>
static void pqd_dispatch_k1(const int k1, F && f) {
    switch (k1) {
        case 1: f(std::integral_constant<int, 1>()); break;
        case 2: f(std::integral_constant<int, 2>()); break;
        case 3: f(std::integral_constant<int, 3>()); break;
        case 4: f(std::integral_constant<int, 4>()); break;
        case 5: f(std::integral_constant<int, 5>()); break;
        case 6: f(std::integral_constant<int, 6>()); break;
        case 7: f(std::integral_constant<int, 7>()); break;
        default: GGML_ABORT("pyqwen_deltanet_prep: conv state of %d columns (supports_op allows 1..%d)", k1, PQD_MAX_K1);
    }
}

void ggml_cuda_op_pyqwen_deltanet_prep(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * qkv = dst->src[0], * beta = dst->src[1], * alpha = dst->src[2];
    const int hk = ggml_get_op_params_i32(dst, 0), hv = (int) dst->src[5]->ne[0];
    const int S  = pqd_head_size(dst), k1 = (int) dst->src[3]->ne[0];
    const float eps = ggml_get_op_params_f32(dst, 1);
    const int threads = (S + WARP_SIZE - 1)/WARP_SIZE*WARP_SIZE;
    pqd_dispatch_k1(k1, [&](auto K1) {
        pyqwen_deltanet_prep_kernel<decltype(K1)::value><<<hk + hv, threads, 0, ctx.stream()>>>(
            (const float *) qkv->data, (const float *) beta->data, (const float *) alpha->data,
            (float *) dst->src[3]->data, (const float *) dst->src[4]->data, (const float *) dst->src[5]->data,
            (const float *) dst->src[6]->data, (float *) dst->data,
            qkv->nb[1]/sizeof(float), beta->nb[1]/sizeof(float), alpha->nb[1]/sizeof(float), (int) qkv->ne[1], hk, hv, S, eps);
    });
    CUDA_CHECK(cudaGetLastError());
}
