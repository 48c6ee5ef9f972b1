// GGML_OP_PYQWEN_DELTANET_PREP (ggml-patches, include/ggml-pyqwen.h) on a CUDA device against ggml's
// CPU backend, through ggml's public API, for passes of 1..17 tokens: its inputs are views of one
// stacked projection output (strided rows, as pyqwen's graph passes them), the output is poisoned
// with NaN before the run, and the conv state it advances in place must come back bit for bit.
// Shapes: the 9B model's (16 k heads, 32 v heads of 128), a tiny test model's, one between and an odd one.
// Built and run by bench/cuda_ops_check.sh; exit code non-zero on any failure.
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml-cuda.h"
#include "ggml-pyqwen.h"

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

struct prep_shape { int hk, hv, S, k1; };

struct prep_result {
    std::vector<float> out, state;
};

// Inputs: y [C + HV*S + 2*HV, n] (q|k|v, z, beta, alpha rows of each token), the conv state and the
// layer's conv weights, dt_bias and a.
static prep_result run_prep(ggml_backend_t backend, const prep_shape & s, int n, const std::vector<float> & y,
                            const std::vector<float> & state, const std::vector<float> & w,
                            const std::vector<float> & bias, const std::vector<float> & a) {
    const int64_t C = (int64_t) (2*s.hk + s.hv)*s.S, W = C + (int64_t) s.hv*s.S + 2*s.hv;
    ggml_init_params ip = { 16*ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true };
    ggml_context * ctx = ggml_init(ip);
    ggml_tensor * Y  = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, W, n);
    ggml_tensor * st = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, s.k1, C);
    ggml_tensor * cw = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, s.k1 + 1, C);
    ggml_tensor * db = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, s.hv);
    ggml_tensor * A  = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, s.hv);
    const size_t es = sizeof(float);
    ggml_tensor * qkv   = ggml_view_2d(ctx, Y, C, n, Y->nb[1], 0);
    ggml_tensor * beta  = ggml_view_2d(ctx, Y, s.hv, n, Y->nb[1], (C + (int64_t) s.hv*s.S)*es);
    ggml_tensor * alpha = ggml_view_2d(ctx, Y, s.hv, n, Y->nb[1], (C + (int64_t) s.hv*s.S + s.hv)*es);
    ggml_tensor * P = ggml_pyqwen_deltanet_prep(ctx, qkv, beta, alpha, st, cw, db, A, s.hk, 1e-6f);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, P);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, backend);
    ggml_backend_tensor_set(Y, y.data(), 0, y.size()*es);
    ggml_backend_tensor_set(st, state.data(), 0, state.size()*es);
    ggml_backend_tensor_set(cw, w.data(), 0, w.size()*es);
    ggml_backend_tensor_set(db, bias.data(), 0, bias.size()*es);
    ggml_backend_tensor_set(A, a.data(), 0, a.size()*es);
    const std::vector<float> poison(ggml_nelements(P), NAN);
    ggml_backend_tensor_set(P, poison.data(), 0, poison.size()*es);
    if (!ggml_backend_supports_op(backend, P)) { fprintf(stderr, "DELTANET_PREP unsupported\n"); std::exit(2); }
    ggml_backend_graph_compute(backend, gf);
    prep_result r;
    r.out.resize(ggml_nelements(P));
    r.state.resize(state.size());
    ggml_backend_tensor_get(P, r.out.data(), 0, r.out.size()*es);
    ggml_backend_tensor_get(st, r.state.data(), 0, r.state.size()*es);
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    return r;
}

int main() {
    ggml_backend_t cpu = ggml_backend_cpu_init(), gpu = ggml_backend_cuda_init(0);
    if (!gpu) { fprintf(stderr, "no CUDA device\n"); return 2; }
    std::mt19937 rng(std::random_device{}());
    std::normal_distribution<float> nd;
    int passed = 0, failed = 0;
    // the last: a head that is not a whole number of warps, a conv kernel of 6
    const prep_shape shapes[] = { {16, 32, 128, 3}, {1, 4, 16, 3}, {2, 6, 64, 3}, {3, 5, 40, 5} };
    for (const prep_shape & s : shapes) {
        const int64_t C = (int64_t) (2*s.hk + s.hv)*s.S, W = C + (int64_t) s.hv*s.S + 2*s.hv;
        for (int n : {1, 2, 3, 5, 8, 9, 17}) { // 9 and 17: the CUDA kernel's token groups of 8
            const auto randn = [&](size_t count, float scale) {
                std::vector<float> v(count);
                for (float & x : v) x = scale*nd(rng);
                return v;
            };
            const std::vector<float> y = randn((size_t) W*n, 1.0f), state = randn((size_t) s.k1*C, 1.0f);
            const std::vector<float> w = randn((size_t) (s.k1 + 1)*C, 0.5f), bias = randn(s.hv, 1.0f);
            std::vector<float> a = randn(s.hv, 1.0f);
            for (float & x : a) x = -std::exp(x); // a = -exp(A_log)
            const prep_result g = run_prep(gpu, s, n, y, state, w, bias, a);
            const prep_result c = run_prep(cpu, s, n, y, state, w, bias, a);
            double err = 0;
            bool finite = true;
            for (size_t i = 0; i < g.out.size(); ++i) {
                finite = finite && std::isfinite(g.out[i]);
                err = std::fmax(err, std::fabs((double) g.out[i] - c.out[i])/(std::fabs((double) c.out[i]) + 1e-3));
            }
            const bool same_state = g.state == c.state;
            // the same float steps; the CUDA build's fast-math exp and a float (CPU: double) norm sum differ by ulps
            const bool ok = finite && same_state && err < 1e-4;
            (ok ? passed : failed)++;
            printf("hk=%2d hv=%2d S=%3d k1=%d n=%2d  max rel err vs CPU %.2e  conv state %s  %s\n", s.hk, s.hv, s.S, s.k1, n, err,
                   same_state ? "same bits" : "DIFFERENT", ok ? "ok" : "FAIL");
        }
    }
    printf("%d passed, %d failed\n", passed, failed);
    ggml_backend_free(gpu); ggml_backend_free(cpu);
    return failed == 0 ? 0 : 1;
}
