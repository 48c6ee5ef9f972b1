// CUDA kernel of GGML_OP_PYQWEN_DELTANET_PREP: CTA h < n_k_heads takes the q and k channels of k head
// h and L2-normalizes both; CTA n_k_heads + v takes the channels of v head v and writes g and beta of v.
// Thread t takes channel t of its head(s): it loads that channel's conv state and weights into
// registers once, runs the conv over the pass's tokens there and stores the state back once. (Shifting
// the state in global memory made each token wait for the previous token's store: an 8-token pass cost
// 3.1x a 1-token one, bench/RESULTS.md.) Tokens go in groups of PQD_GROUP, whose inputs are loaded
// before the first conv step and whose q/k norms share one block reduction. The per-element steps are
// shared with the CPU kernel (pyqwen-deltanet-step.h).
#include "pyqwen-deltanet.cuh"
#include "pyqwen-warp-sum.cuh"
#include "ggml-pyqwen.h"
#include "pyqwen-deltanet-step.h"
#include "pyqwen-graph.cuh"

#include <algorithm>
#include <map>
#include <mutex>

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

// The step kernel's arrival counters (an atomicInc that wraps back to 0, so every launch leaves them at
// zero): one zeroed set per stream, as launches on a stream run one at a time. Made on first use, which
// runs before any CUDA graph capture (ggml warms its graphs up uncaptured).
static unsigned int * pyqwen_arrivals(cudaStream_t stream, const int n) {
    static std::mutex mutex;
    static std::map<cudaStream_t, std::pair<unsigned int *, int>> sets;
    std::lock_guard<std::mutex> lock(mutex);
    std::pair<unsigned int *, int> & set = sets[stream];
    if (set.second < n) {
        if (set.first) {
            CUDA_CHECK(cudaStreamSynchronize(stream));
            CUDA_CHECK(cudaFree(set.first));
        }
        set.second = std::max(n, 64);
        CUDA_CHECK(cudaMalloc(&set.first, set.second*sizeof(unsigned int)));
        CUDA_CHECK(cudaMemsetAsync(set.first, 0, set.second*sizeof(unsigned int), stream));
    }
    return set.first;
}

// The whole DeltaNet step of a decode or verify pass in one kernel: the prep above, then
// ggml_gated_delta_net's recurrence (scalar decay, one sequence, no snapshots), whose new state goes back
// in place. CTA (v, c) takes state columns [8c, 8c + 8) of v head v; warp w holds column w, 4 rows a lane.
// Narrow CTAs: 512 for 32 v heads, ~4 an SM on an H200, where 32-column ones put one on most SMs (24 layers'
// launches with the early trigger below: 82.5 against 157.4 us at 1 token, 216.6 against 453.9 at 8 in
// deltanet_step_bench, whose back-to-back launches exaggerate; tg128 +1.2% in the model). A CTA
// convolves and L2-normalizes the q and k channels of its k head (v % hk, ggml_gated_delta_net's head
// broadcast), a thread a channel, and the conv of its 8 v channels, whose state is its alone. Every
// CTA of a k head reads that head's q/k conv state, so the last of them to get there stores the new one
// (arrivals[kh], which wraps back to 0 for the next launch). Saves the prep's launch and the round trip of
// its output through memory.
#define PQF_S    128 // the head size it takes (every Qwen3.x)
#define PQF_COLS 8   // state columns a CTA
#define PQF_ROWS 4   // state rows a thread: a warp a column
static_assert(PQF_COLS*(PQF_S/PQF_ROWS) == 2*PQF_S, "a CTA's 2*PQF_S threads cover its columns");

template <int K1, int NT>
static __global__ void __launch_bounds__(2*PQF_S)
pyqwen_deltanet_step_kernel(
        const float * qkv, const float * beta, const float * alpha, float * conv_state, const float * conv_w,
        const float * bias, const float * a, float * state, float * attn, unsigned int * arrivals,
        const int64_t sq, const int64_t sb, const int64_t sa, const int n, const int hk, const int hv,
        const float eps, const float scale) {
    // the next kernels may launch now: each waits for this whole grid before it reads, and meanwhile the
    // GEMV after the gated norm streams its first weight chunks (the step's CTAs leave room on the SMs)
    ggml_cuda_pdl_lc();
    const int v = blockIdx.x, col0 = blockIdx.y*PQF_COLS, t = threadIdx.x;
    const int kh = v % hk, lane = t % WARP_SIZE, warp = t / WARP_SIZE;
    const bool is_k = t >= PQF_S, has_v = t < PQF_COLS;
    const int64_t ch  = (int64_t) (is_k ? hk + kh : kh)*PQF_S + t % PQF_S; // the thread's q or k channel
    const int64_t chv = (int64_t) (2*hk + v)*PQF_S + col0 + t;              // and, has_v, its v channel

    // the conv weights and the decay's constants: loaded while the previous kernel finishes
    float w[K1 + 1], wv[K1 + 1];
#pragma unroll
    for (int j = 0; j <= K1; ++j) {
        w[j]  = conv_w[ch*(K1 + 1) + j];
        wv[j] = has_v ? conv_w[chv*(K1 + 1) + j] : 0.0f;
    }
    const float bias_v = bias[v], a_v = a[v];
    ggml_cuda_pdl_sync();
    // token t's gate inputs (thread t < n), loaded with the others rather than after the convs' reductions
    const float alpha_t = t < n ? alpha[t*sa + v] : 0.0f, beta_t = t < n ? beta[t*sb + v] : 0.0f;
    float st[K1], stv[K1];
#pragma unroll
    for (int j = 0; j < K1; ++j) {
        st[j]  = conv_state[ch*K1 + j];
        stv[j] = has_v ? conv_state[chv*K1 + j] : 0.0f;
    }
    // the state, stored transposed: row i of column c at (v*S + c)*S + i
    const int col = t / (PQF_S/PQF_ROWS), r0 = t % (PQF_S/PQF_ROWS)*PQF_ROWS;
    float4 * sp = (float4 *) (state + ((int64_t) v*PQF_S + col0 + col)*PQF_S + r0);
    float s[PQF_ROWS];
#pragma unroll
    for (int i = 0; i < PQF_ROWS/4; ++i) {
        const float4 f = sp[i];
        s[4*i] = f.x; s[4*i + 1] = f.y; s[4*i + 2] = f.z; s[4*i + 3] = f.w;
    }

    __shared__ float qs[NT][PQF_S], ks[NT][PQF_S], vs[NT][PQF_COLS], gs[NT], bs[NT];
    __shared__ float partial[NT][2*PQF_S/WARP_SIZE];
    __shared__ bool last;
    // Every token's q/k and v inputs are loaded before the first conv step, with no branch between the loads
    // (a thread without a v channel loads its q/k one twice and convolves zeros), and the squares are summed
    // for every slot of the group (zeros past n): the loads and the reductions overlap, where a token at a
    // time waited for its load and then its reduction.
    const int64_t chv_or_ch = has_v ? chv : ch;
    float x[NT], xv[NT], y[NT] = {}, yv[NT] = {};
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        x[j]  = j < n ? qkv[j*sq + ch] : 0.0f;
        xv[j] = j < n ? qkv[j*sq + chv_or_ch] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        if (j < n) {
            y[j]  = pqd_conv_silu(st, w, K1, x[j]);
            yv[j] = pqd_conv_silu(stv, wv, K1, xv[j]);
        }
    }
    // the squares' sums over the warp for the q/k norms. A group's 8 at once (pyqwen_warp_sum8, lane 4j: slot j): 9
    // shuffles, not 40; shuffles bound the group kernel (deltanet_step_bench, twenty-second session)
    static_assert(PQD_GROUP == 8, "pyqwen_warp_sum8's 8 slots");
    if constexpr (NT == PQD_GROUP) {
        float squares[NT];
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            squares[j] = y[j]*y[j];
        }
        const float ss = pyqwen_warp_sum8(squares);
        if (lane % 4 == 0) {
            partial[lane/4][warp] = ss;
        }
    } else {
        float ss[NT];
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            ss[j] = warp_reduce_sum(y[j]*y[j]);
        }
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            if (lane == 0) {
                partial[j][warp] = ss[j];
            }
        }
    }
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        if (has_v) {
            vs[j][t] = yv[j];
        }
    }
    if (t < n) {
        gs[t] = expf(pqd_decay(alpha_t, bias_v, a_v));
        bs[t] = pqd_sigmoid(beta_t);
    }
    __syncthreads();
    // every slot of the group, without a branch a slot, so that their reductions interleave (slots past n hold
    // zeros; they are never read)
    const int w0 = is_k ? PQF_S/WARP_SIZE : 0; // the q or k channels' warps
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < PQF_S/WARP_SIZE; ++i) {
            sum += partial[j][w0 + i];
        }
        (is_k ? ks : qs)[j][t % PQF_S] = y[j]*rsqrtf(sum + eps);
    }
    if (has_v) {
#pragma unroll
        for (int j = 0; j < K1; ++j) {
            conv_state[chv*K1 + j] = stv[j];
        }
    }
    __syncthreads(); // every thread has read its q/k conv state (and the tokens' q, k are in shared memory)
    // this CTA's arrival at its k head: the atomic's round trip overlaps the recurrence, and the last CTA to
    // arrive stores the head's new q/k conv state after it
    const unsigned int readers = (unsigned int) (hv/hk*gridDim.y);
    unsigned int arrival = 0;
    if (t == 0) {
        arrival = atomicInc(&arrivals[kh], readers - 1);
    }

    // the recurrence, as ggml_gated_delta_net's: kv = S^T k, delta = (v - g kv) beta, S = g S + k delta^T,
    // out = scale S^T q; a column's sums over its warp. Only kv's sum is on the chain from token to token: a group
    // sums its outputs after the loop, 8 at once.
    [[maybe_unused]] float outs[NT];
#pragma unroll
    for (int tok = 0; tok < NT; ++tok) {
        if (tok < n) { // uniform
            const float g = gs[tok], b = bs[tok];
            float kv = 0.0f;
#pragma unroll
            for (int i = 0; i < PQF_ROWS; ++i) {
                kv += s[i]*ks[tok][r0 + i];
            }
#pragma unroll
            for (int o = 1; o < PQF_S/PQF_ROWS; o <<= 1) {
                kv += __shfl_xor_sync(0xFFFFFFFF, kv, o, WARP_SIZE);
            }
            const float delta = (vs[tok][col] - g*kv)*b;
            float out = 0.0f;
#pragma unroll
            for (int i = 0; i < PQF_ROWS; ++i) {
                s[i] = g*s[i] + ks[tok][r0 + i]*delta;
                out += s[i]*qs[tok][r0 + i];
            }
            if constexpr (NT == PQD_GROUP) {
                outs[tok] = out;
            } else {
#pragma unroll
                for (int o = 1; o < PQF_S/PQF_ROWS; o <<= 1) {
                    out += __shfl_xor_sync(0xFFFFFFFF, out, o, WARP_SIZE);
                }
                if (t % (PQF_S/PQF_ROWS) == 0) {
                    attn[((int64_t) tok*hv + v)*PQF_S + col0 + col] = out*scale;
                }
            }
        } else if constexpr (NT == PQD_GROUP) {
            outs[tok] = 0.0f;
        }
    }
    if constexpr (NT == PQD_GROUP) { // a warp a column
        static_assert(PQF_S/PQF_ROWS == WARP_SIZE, "a column's rows in one warp");
        const float out = pyqwen_warp_sum8(outs);
        if (lane % 4 == 0 && lane/4 < n) {
            attn[((int64_t) (lane/4)*hv + v)*PQF_S + col0 + col] = out*scale;
        }
    }
#pragma unroll
    for (int i = 0; i < PQF_ROWS/4; ++i) {
        sp[i] = make_float4(s[4*i], s[4*i + 1], s[4*i + 2], s[4*i + 3]);
    }
    if (t == 0) {
        last = arrival == readers - 1;
    }
    __syncthreads();
    if (last) {
#pragma unroll
        for (int j = 0; j < K1; ++j) {
            conv_state[ch*K1 + j] = st[j];
        }
    }
}

// Launches the step kernel's instance for n tokens: a decode token's (NT = 1) carries no empty group slots.
template <int K1, typename... Args>
static void pqf_launch_step(const int n, const ggml_cuda_kernel_launch_params & params, Args... args) {
    if (n == 1) {
        ggml_cuda_kernel_launch(pyqwen_deltanet_step_kernel<K1, 1>, params, args...);
    } else {
        ggml_cuda_kernel_launch(pyqwen_deltanet_step_kernel<K1, PQD_GROUP>, params, args...);
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

// A view of `src` of ne[0..3] at offset `offs` bytes with rows nb1, nb2 apart (0: packed).
static bool pqf_is_view(const ggml_tensor * t, const ggml_tensor * src, const size_t offs, const int64_t ne0, const int64_t ne1,
                        const int64_t ne2, const size_t nb1, const size_t nb2) {
    return t->view_src == src && t->view_offs == offs && t->type == GGML_TYPE_F32 && t->ne[0] == ne0 && t->ne[1] == ne1 &&
           t->ne[2] == ne2 && t->ne[3] == 1 && t->nb[0] == sizeof(float) && (nb1 == 0 || (t->nb[1] == nb1 && t->nb[2] == nb2));
}

int ggml_cuda_pyqwen_deltanet_try_fuse(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, const int i) {
    const ggml_tensor * prep = cgraph->nodes[i];
    // read only through the five views the recurrence takes (nothing else may see its unwritten output)
    if (prep->op != GGML_OP_PYQWEN_DELTANET_PREP || (prep->flags & GGML_TENSOR_FLAG_OUTPUT) || ggml_node_get_use_count(cgraph, i) != 5) {
        return 0;
    }
    const ggml_tensor * qkv = prep->src[0], * beta = prep->src[1], * alpha = prep->src[2];
    const int hk = ggml_get_op_params_i32(prep, 0), hv = (int) prep->src[5]->ne[0];
    const int S = pqd_head_size(prep), k1 = (int) prep->src[3]->ne[0], n = (int) qkv->ne[1];
    if (S != PQF_S || n > PQD_GROUP || hv % hk != 0 || k1 > PQD_MAX_K1) {
        return 0;
    }
    // the conv weights, dt_bias and A are read before the kernel waits for the previous one: weights no node computes
    for (int s = 4; s <= 6; ++s) {
        if (prep->src[s]->op != GGML_OP_NONE) {
            return 0;
        }
    }
    // the recurrence: the next node that computes anything, over views of the prep's output
    const int i_gdn = pyqwen_next_op(cgraph, i + 1);
    if (i_gdn >= cgraph->n_nodes) {
        return 0;
    }
    const ggml_tensor * gdn = cgraph->nodes[i_gdn];
    const int64_t C = (int64_t) (2*hk + hv)*S;
    const size_t es = sizeof(float);
    // its output read through two views, the outputs and the new state (which only the CPY reads)
    if (gdn->op != GGML_OP_GATED_DELTA_NET || ggml_get_op_params_i32(gdn, 0) != 1 || (gdn->flags & GGML_TENSOR_FLAG_OUTPUT) ||
        ggml_node_get_use_count(cgraph, i_gdn) != 2 ||
        !pqf_is_view(gdn->src[0], prep, 0,              S, hk, n, S*es, C*es) ||
        !pqf_is_view(gdn->src[1], prep, S*hk*es,        S, hk, n, S*es, C*es) ||
        !pqf_is_view(gdn->src[2], prep, 2*S*hk*es,      S, hv, n, S*es, C*es) ||
        !pqf_is_view(gdn->src[3], prep, C*n*es,         1, hv, n, 0, 0) || !ggml_is_contiguous(gdn->src[3]) ||
        !pqf_is_view(gdn->src[4], prep, (C + hv)*n*es,  1, hv, n, 0, 0) || !ggml_is_contiguous(gdn->src[4])) {
        return 0;
    }
    // the new state copied back onto the old: the next computing node, a CPY from the output's tail
    const ggml_tensor * state = gdn->src[5];
    const int i_cpy = pyqwen_next_op(cgraph, i_gdn + 1);
    if (i_cpy >= cgraph->n_nodes) {
        return 0;
    }
    const ggml_tensor * cpy = cgraph->nodes[i_cpy];
    const int64_t D = (int64_t) S*S*hv;
    if (cpy->op != GGML_OP_CPY || (cpy->flags & GGML_TENSOR_FLAG_OUTPUT) || state->type != GGML_TYPE_F32 ||
        !ggml_is_contiguous(state) || ggml_nelements(state) != D ||
        cpy->src[0]->view_src != gdn || cpy->src[0]->view_offs != (size_t) S*hv*n*es || ggml_nelements(cpy->src[0]) != D ||
        !ggml_is_contiguous(cpy->src[0]) || cpy->src[1]->data != state->data || cpy->src[1]->type != GGML_TYPE_F32 ||
        !ggml_is_contiguous(cpy->src[1]) || ggml_nelements(cpy->src[1]) != D) {
        return 0;
    }
    const float eps = ggml_get_op_params_f32(prep, 1);
    unsigned int * arrivals = pyqwen_arrivals(ctx.stream(), hk);
    pqd_dispatch_k1(k1, [&](auto K1) {
        pqf_launch_step<decltype(K1)::value>(n, ggml_cuda_kernel_launch_params(dim3(hv, S/PQF_COLS), dim3(2*S), 0, ctx.stream()),
            (const float *) qkv->data, (const float *) beta->data, (const float *) alpha->data,
            (float *) prep->src[3]->data, (const float *) prep->src[4]->data, (const float *) prep->src[5]->data,
            (const float *) prep->src[6]->data, (float *) state->data, (float *) gdn->data, arrivals,
            (int64_t) (qkv->nb[1]/sizeof(float)), (int64_t) (beta->nb[1]/sizeof(float)), (int64_t) (alpha->nb[1]/sizeof(float)),
            n, hk, hv, eps, 1.0f/sqrtf((float) S));
    });
    CUDA_CHECK(cudaGetLastError());
    return i_cpy - i;
}
