// The integrated path of the interleaved GEMV, through ggml's public API on a CUDA device: weights
// uploaded into the CUDA_IL buffer type must read back as ggml's bytes (get_tensor un-permutes), and
// MUL_MAT on them (M = 1..8 through the GEMV, M = 13 as two launches) must be as close to the exact
// product (float64 over the dequantized weights) as upstream's CUDA kernels on the same inputs. M = 24 is
// three GEMV launches, M = 40 and 64 take the prefill path (upstream's kernels on the weight moved to
// ggml's layout in place and back, or where a tile exceeds a CTA's shared memory, and for W4A8, on slabs
// of it in the pool); the weight is read back after the product, so it must be interleaved again. Every weight is also uploaded in row pieces, as pyqwen's stacked projections are,
// some starting inside the partial last tile. Some row counts add a residual to the product (ADD(R,
// MUL_MAT), which the GEMV fuses into its output; the prefill path does not), some take RMS_NORM(x) * w
// (the norm prologue of the activation quantization), some x * sigmoid(gate) with the gate gathered from
// between query rows (attention's output gate prologue), and decode-sized ones also run as ARGMAX(MUL_MAT),
// which the GEMV computes without writing the product. Chains of a residual product and the next
// block's input norm and projection check the sums of squares the first leaves for the second. ggml's
// CPU backend is printed alongside: its K-quant products round the activations per 256 values (Q8_K),
// the GPU kernels per 32, so it sits ~1e-2 away on those types whichever GPU kernel runs. pyqwen's
// PQ_W4A8 (random codes and scales, a non-uniform codebook) has no upstream kernel: its "upstream" is
// upstream's Q8_0 kernels on its Q8_0 expansion (what pyqwen stores outside the GEMV). Exit code
// non-zero on any failure.
// Built and run by bench/cuda_ops_check.sh.
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml-cuda.h"
#include "ggml-pyqwen.h"

#include <cmath>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

// The ops around the product, as in a model's graph (each one the GEMV fuses on decode-sized rows).
struct around {
    std::vector<float> norm;   // k floats: the product takes RMS_NORM(x) * norm (the input norms)
    // m rows of 2k + 8 floats: the product takes x * sigmoid(gate), the gate of head h (head floats) at
    // 2*head*h + head of its row, between the query rows (attention's output gate, CONT -> SIGMOID -> MUL)
    std::vector<float> gate;
    int                head = 0;
    std::vector<float> res;    // m x n floats: ADD(res, product) (the residual stream)
    bool               argmax = false; // ARGMAX over each token's products (greedy decoding)
    // the next block's input norm and projection over the result, which the GEMV feeds its sums of
    // squares: the output is then W2 . (RMS_NORM(result) * norm2), n2 x m
    const std::vector<uint8_t> * w2 = nullptr;
    int                          n2 = 0;
    std::vector<float>           norm2;
};
constexpr float NORM_EPS = 1e-6f;

// dst[m, n] = W[n, :] . x[m, :] for W (type, k x n) and x (f32, k x m) on `backend`, W in `wbuft`, with the
// ops of `a` around it (argmax: dst[m] holds the rows, as floats). With `pieces`, W is uploaded as row
// ranges split at n/3, 2n/3, n - 3 and n - 1.
static std::vector<float> mul_mat(ggml_backend_t backend, ggml_backend_buffer_type_t wbuft, ggml_type type,
                                  const std::vector<uint8_t> & w, const std::vector<float> & x, int k, int n, int m,
                                  const around & a, std::vector<uint8_t> * w_back, bool pieces) {
    ggml_init_params ip = { 16*ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true };
    ggml_context * cw = ggml_init(ip), * cx = ggml_init(ip);
    ggml_tensor * W = ggml_new_tensor_2d(cw, type, k, n);
    ggml_tensor * X = ggml_new_tensor_2d(cx, GGML_TYPE_F32, k, m);
    ggml_tensor * N = a.norm.empty() ? nullptr : ggml_new_tensor_1d(cx, GGML_TYPE_F32, k);
    ggml_tensor * R = a.res.empty() ? nullptr : ggml_new_tensor_2d(cx, GGML_TYPE_F32, n, m);
    ggml_tensor * W2 = a.w2 ? ggml_new_tensor_2d(cw, type, n, a.n2) : nullptr;
    ggml_tensor * N2 = a.w2 ? ggml_new_tensor_1d(cx, GGML_TYPE_F32, n) : nullptr;
    ggml_tensor * G = a.gate.empty() ? nullptr : ggml_new_tensor_2d(cx, GGML_TYPE_F32, 2*k + 8, m);
    ggml_tensor * in = N ? ggml_mul(cx, ggml_rms_norm(cx, X, NORM_EPS), N) : X;
    if (G) {
        const size_t es = sizeof(float);
        ggml_tensor * gv = ggml_view_3d(cx, G, a.head, k/a.head, m, 2*a.head*es, G->nb[1], a.head*es);
        in = ggml_mul(cx, X, ggml_sigmoid(cx, ggml_cont_2d(cx, gv, k, m)));
    }
    ggml_tensor * Y = ggml_mul_mat(cx, W, in);
    if (R) Y = ggml_add(cx, R, Y);
    if (a.argmax) Y = ggml_argmax(cx, Y);
    if (W2) Y = ggml_mul_mat(cx, W2, ggml_mul(cx, ggml_rms_norm(cx, Y, NORM_EPS), N2));
    ggml_backend_buffer_t bw = ggml_backend_alloc_ctx_tensors_from_buft(cw, wbuft);
    ggml_backend_buffer_set_usage(bw, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    ggml_backend_buffer_t bx = ggml_backend_alloc_ctx_tensors(cx, backend);
    if (pieces) {
        const size_t row = ggml_row_size(type, k);
        const int cuts[] = { 0, n/3, 2*n/3, std::max(2*n/3, n - 3), std::max(2*n/3, n - 1), n };
        for (int i = 0; i + 1 < 6; ++i) {
            if (cuts[i + 1] > cuts[i]) {
                ggml_backend_tensor_set(W, w.data() + cuts[i]*row, cuts[i]*row, (size_t) (cuts[i + 1] - cuts[i])*row);
            }
        }
    } else {
        ggml_backend_tensor_set(W, w.data(), 0, w.size());
    }
    if (W2) ggml_backend_tensor_set(W2, a.w2->data(), 0, a.w2->size());
    if (N2) ggml_backend_tensor_set(N2, a.norm2.data(), 0, a.norm2.size()*sizeof(float));
    ggml_backend_tensor_set(X, x.data(), 0, x.size()*sizeof(float));
    if (N) ggml_backend_tensor_set(N, a.norm.data(), 0, a.norm.size()*sizeof(float));
    if (R) ggml_backend_tensor_set(R, a.res.data(), 0, a.res.size()*sizeof(float));
    if (G) ggml_backend_tensor_set(G, a.gate.data(), 0, a.gate.size()*sizeof(float));
    ggml_cgraph * gf = ggml_new_graph(cx);
    ggml_build_forward_expand(gf, Y);
    for (int i = 0; i < ggml_graph_n_nodes(gf); ++i) {
        if (!ggml_backend_supports_op(backend, ggml_graph_node(gf, i))) { fprintf(stderr, "%s unsupported\n", ggml_op_desc(ggml_graph_node(gf, i))); std::exit(2); }
    }
    ggml_backend_graph_compute(backend, gf);
    if (w_back) { // after the product, which may have moved the weight's bytes and back
        w_back->resize(w.size());
        ggml_backend_tensor_get(W, w_back->data(), 0, w.size());
    }
    std::vector<float> y(a.argmax ? (size_t) m : (size_t) (W2 ? a.n2 : n)*m);
    if (a.argmax) {
        std::vector<int32_t> rows(m);
        ggml_backend_tensor_get(Y, rows.data(), 0, rows.size()*sizeof(int32_t));
        std::copy(rows.begin(), rows.end(), y.begin());
    } else {
        ggml_backend_tensor_get(Y, y.data(), 0, y.size()*sizeof(float));
    }
    ggml_backend_buffer_free(bw); ggml_backend_buffer_free(bx);
    ggml_free(cw); ggml_free(cx);
    return y;
}

// y[m, n] = W[n, :] . x'[m, :] (+ res) in float64, x' = x, its RMS norm times a.norm, or x times the
// sigmoid of a.gate.
static std::vector<double> exact_product(const std::vector<float> & w, const std::vector<float> & x, int k, int n, int m,
                                         const around & a) {
    std::vector<double> y((size_t) n*m), xt(k);
    for (int t = 0; t < m; ++t) {
        double ss = 0;
        for (int i = 0; i < k; ++i) ss += (double) x[(size_t) t*k + i]*x[(size_t) t*k + i];
        const double scale = a.norm.empty() ? 1.0 : 1.0/std::sqrt(ss/k + NORM_EPS);
        for (int i = 0; i < k; ++i) xt[i] = x[(size_t) t*k + i]*scale*(a.norm.empty() ? 1.0 : a.norm[i]);
        for (int i = 0; i < k && !a.gate.empty(); ++i) {
            const double g = a.gate[(size_t) t*(2*k + 8) + (size_t) (i/a.head)*2*a.head + a.head + i % a.head];
            xt[i] *= 1.0/(1.0 + std::exp(-g));
        }
        for (int r = 0; r < n; ++r) {
            double acc = a.res.empty() ? 0.0 : a.res[(size_t) t*n + r];
            for (int i = 0; i < k; ++i) acc += (double) w[(size_t) r*k + i]*xt[i];
            y[(size_t) t*n + r] = acc;
        }
    }
    return y;
}

// n rows of k random weights of `type` and what they decode to (wd). PQ_W4A8 has no quantizer: random
// codes, scale bytes 0x28..0x47 (e4m3 0.5..3.75; so levels up to 28) and d, under a registered codebook.
static std::vector<uint8_t> random_weights(ggml_type type, int k, int n, std::mt19937 & rng, std::vector<float> & wd) {
    std::normal_distribution<float> nd;
    std::vector<uint8_t> w(ggml_row_size(type, k)*n);
    if (type == GGML_TYPE_PQ_W4A8) {
        static const float codebook[16] = {-7.5f, -6.0f, -4.4f, -3.1f, -2.0f, -1.2f, -0.6f, -0.15f, 0.2f, 0.65f, 1.3f, 2.1f, 3.2f, 4.5f, 6.1f, 8.0f};
        const int32_t id = ggml_pyqwen_w4a8_codebook(codebook);
        for (size_t b = 0; b < w.size(); b += ggml_row_size(type, 256)) {
            const float d = 0.01f*nd(rng);
            memcpy(w.data() + b, &d, 4);
            memcpy(w.data() + b + 4, &id, 4);
            for (int i = 8; i < 24; ++i) w[b + i] = (uint8_t) (0x28 + rng() % 32);
            for (int i = 24; i < 152; ++i) w[b + i] = (uint8_t) rng();
        }
    } else {
        std::vector<float> f((size_t) k*n);
        for (float & v : f) v = nd(rng);
        ggml_quantize_chunk(type, f.data(), w.data(), 0, n, k, nullptr);
    }
    wd.resize((size_t) k*n);
    ggml_get_type_traits(type)->to_float(w.data(), wd.data(), (int64_t) k*n);
    return w;
}

// What upstream's CUDA kernels multiply for these weights: the weights, or W4A8's Q8_0 expansion.
static ggml_type upstream_type(ggml_type type) { return type == GGML_TYPE_PQ_W4A8 ? GGML_TYPE_Q8_0 : type; }
static std::vector<uint8_t> upstream_weights(ggml_type type, const std::vector<uint8_t> & w, int k, int n) {
    if (type != GGML_TYPE_PQ_W4A8) return w;
    std::vector<uint8_t> q8(ggml_row_size(GGML_TYPE_Q8_0, k)*n);
    ggml_pyqwen_w4a8_to_q8_0(w.data(), q8.data(), (int64_t) k*n);
    return q8;
}

static double rel_l2(const std::vector<float> & y, const std::vector<double> & ref) {
    double e2 = 0, r2 = 0;
    for (size_t i = 0; i < y.size(); ++i) {
        e2 += (y[i] - ref[i])*(y[i] - ref[i]);
        r2 += ref[i]*ref[i];
    }
    return std::sqrt(e2/r2);
}

int main() {
    ggml_backend_t cpu = ggml_backend_cpu_init(), gpu = ggml_backend_cuda_init(0);
    if (!gpu) { fprintf(stderr, "no CUDA device\n"); return 2; }
    std::mt19937 rng(std::random_device{}());
    std::normal_distribution<float> nd;
    int passed = 0, failed = 0;
    const ggml_type types[] = { GGML_TYPE_Q4_0, GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, GGML_TYPE_PQ_W4A8 };
    // k, n; the second to fourth are the tiny test model's (tests/test_weight_types.py): stacked in_proj,
    // ffn_down, ssm_beta; {4096, 8200} is larger than the prefill path's 16 MiB slabs in every type; a Q8_0
    // tile of k = 16384 (278 KiB) exceeds a CTA's shared memory, so its prefill takes the slabs
    const int shapes[][2] = { {256, 37}, {256, 776}, {512, 256}, {256, 4}, {512, 5}, {1024, 100}, {4096, 1000}, {4096, 8200}, {16384, 40} };
    for (ggml_type type : types) {
        for (const auto & s : shapes) {
            const int k = s[0], n = s[1];
            std::vector<float> wd; // what the kernels multiply by
            const std::vector<uint8_t> w = random_weights(type, k, n, rng, wd), wu = upstream_weights(type, w, k, n);
            const bool large = (int64_t) k*n > (1 << 24); // the float64 reference is slow: two row counts
            for (int m : {1, 2, 3, 5, 8, 13, 24, 40, 64}) {
                if (large && m != 5 && m != 40) continue;
                const bool pieces = m % 2 == 1;
                // the residual epilogue in one, two and three GEMV launches and on the prefill path; the
                // norm prologue in one and two launches, with and without the residual
                const bool residual = m == 3 || m == 13 || m == 24 || m == 40, norm = m == 1 || m == 5 || m == 13;
                // the output gate prologue, alone and with the residual, and unfused on the prefill path
                const bool gate = (m == 2 || m == 3 || m == 8 || m == 40) && k <= 4096;
                around a;
                std::vector<float> x((size_t) k*m);
                for (float & v : x) v = 4.0f*nd(rng);
                if (residual) {
                    a.res.resize((size_t) n*m);
                    for (float & v : a.res) v = 8.0f*nd(rng);
                }
                if (norm) {
                    a.norm.resize(k);
                    for (float & v : a.norm) v = 1.0f + 0.5f*nd(rng);
                }
                if (gate) {
                    a.head = std::min(k, 128);
                    a.gate.resize((size_t) (2*k + 8)*m);
                    for (float & v : a.gate) v = 2.0f*nd(rng);
                }
                std::vector<uint8_t> back;
                const std::vector<float> y  = mul_mat(gpu, ggml_backend_cuda_gemv_il_buffer_type(0), type, w, x, k, n, m, a, &back, pieces);
                const std::vector<float> yu = mul_mat(gpu, ggml_backend_cuda_buffer_type(0), upstream_type(type), wu, x, k, n, m, a, nullptr, false);
                const std::vector<float> yc = mul_mat(cpu, ggml_backend_cpu_buffer_type(), type, w, x, k, n, m, a, nullptr, false);
                const std::vector<double> exact = exact_product(wd, x, k, n, m, a);
                bool finite = true;
                for (float v : y) finite = finite && std::isfinite(v);
                const double e = rel_l2(y, exact), eu = rel_l2(yu, exact), ec = rel_l2(yc, exact);
                // the same 8-bit activation rounding as upstream's mmvq / mmq: no more than 1.5x its error
                const bool ok = finite && back == w && e <= 1.5*eu + 1e-6;
                (ok ? passed : failed)++;
                printf("%-5s k=%5d n=%5d m=%2d %-6s%s%s%s  rel_l2 vs exact: ours %.2e  upstream CUDA %.2e  CPU %.2e  get_tensor %s  %s\n",
                       ggml_type_name(type), k, n, m, pieces ? "pieces" : "whole", norm ? " norm" : "     ", gate ? " gate" : "     ",
                       residual ? " +res" : "     ", e, eu, ec,
                       back == w ? "same bytes" : "DIFFERENT BYTES", ok ? "ok" : "FAIL");
                if (m <= 24 && !residual) {
                    // ARGMAX fused into the GEMV: the first row of each token's largest product of the same kernel
                    around am = a;
                    am.argmax = true;
                    const std::vector<float> rows = mul_mat(gpu, ggml_backend_cuda_gemv_il_buffer_type(0), type, w, x, k, n, m, am, nullptr, false);
                    bool same = true;
                    for (int t = 0; t < m; ++t) {
                        const float * yt = y.data() + (size_t) t*n;
                        same = same && rows[t] == (float) (std::max_element(yt, yt + n) - yt);
                    }
                    (same ? passed : failed)++;
                    printf("%-5s k=%5d n=%5d m=%2d              ARGMAX fused: %s\n", ggml_type_name(type), k, n, m, same ? "same rows  ok" : "DIFFERENT ROWS  FAIL");
                }
            }
        }
    }
    // A residual product whose result the next block's input norm reads: the GEMV leaves the result's sums
    // of squares for the norm's quantization (decode-sized rows); n = 256 is 16 tiles, 4096 is 256
    const int chains[][3] = { {512, 256, 200}, {1024, 4096, 200} }; // k, n, n2
    for (ggml_type type : types) {
        for (const auto & c : chains) {
            const int k = c[0], n = c[1], n2 = c[2];
            std::vector<float> wd, wd2;
            const std::vector<uint8_t> w = random_weights(type, k, n, rng, wd), w2 = random_weights(type, n, n2, rng, wd2);
            const std::vector<uint8_t> wu = upstream_weights(type, w, k, n), wu2 = upstream_weights(type, w2, n, n2);
            for (int m : {1, 3, 8, 13}) {
                around a;
                std::vector<float> x((size_t) k*m);
                for (float & v : x) v = 4.0f*nd(rng);
                a.res.resize((size_t) n*m);
                for (float & v : a.res) v = 8.0f*nd(rng);
                a.w2 = &w2;
                a.n2 = n2;
                a.norm2.resize(n);
                for (float & v : a.norm2) v = 1.0f + 0.5f*nd(rng);
                const std::vector<float> y  = mul_mat(gpu, ggml_backend_cuda_gemv_il_buffer_type(0), type, w, x, k, n, m, a, nullptr, true);
                around au = a;
                au.w2 = &wu2;
                const std::vector<float> yu = mul_mat(gpu, ggml_backend_cuda_buffer_type(0), upstream_type(type), wu, x, k, n, m, au, nullptr, false);
                // float64 through both products
                const std::vector<double> y1 = exact_product(wd, x, k, n, m, a);
                around a2;
                a2.norm = a.norm2;
                const std::vector<double> exact = exact_product(wd2, std::vector<float>(y1.begin(), y1.end()), n, n2, m, a2);
                bool finite = true;
                for (float v : y) finite = finite && std::isfinite(v);
                const double e = rel_l2(y, exact), eu = rel_l2(yu, exact);
                const bool ok = finite && e <= 1.5*eu + 1e-6;
                (ok ? passed : failed)++;
                printf("%-5s k=%5d n=%5d m=%2d  +res, then norm and n2=%d: rel_l2 vs exact: ours %.2e  upstream CUDA %.2e  %s\n",
                       ggml_type_name(type), k, n, m, n2, e, eu, ok ? "ok" : "FAIL");
            }
        }
    }
    printf("%d passed, %d failed\n", passed, failed);
    ggml_backend_free(gpu); ggml_backend_free(cpu);
    return failed == 0 ? 0 : 1;
}
