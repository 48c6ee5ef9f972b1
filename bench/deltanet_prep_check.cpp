// GGML_OP_PYQWEN_DELTANET_PREP (ggml-patches, include/ggml-pyqwen.h) on a CUDA device against ggml's
// CPU backend, through ggml's public API, for passes of 1..17 tokens: its inputs are views of one
// stacked projection output (strided rows, as pyqwen's graph passes them), the output is poisoned
// with NaN before the run, and the conv state it advances in place must come back bit for bit.
// Shapes: the 9B model's (16 k heads, 32 v heads of 128), a tiny test model's, one between and an odd one.
// Then the whole DeltaNet step as pyqwen's graph builds it (prep, ggml_gated_delta_net, the new state copied
// back), which the CUDA backend runs as one kernel for heads of 128 and up to 8 tokens: outputs, recurrent
// state and conv state against the CPU backend.
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

// The prep as pyqwen's graph builds it, over views of one stacked projection output y [C + HV*S + 2*HV, n]
// (q|k|v, z, beta, alpha rows of each token), with the conv state, the layer's conv weights, dt_bias and a:
// the input tensors, to be filled once allocated (set_prep), and the prep node.
struct prep_graph {
    ggml_tensor * y, * conv, * w, * bias, * a, * P;
};

static prep_graph build_prep(ggml_context * ctx, const prep_shape & s, int n) {
    const int64_t C = (int64_t) (2*s.hk + s.hv)*s.S, W = C + (int64_t) s.hv*s.S + 2*s.hv;
    prep_graph g;
    g.y    = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, W, n);
    g.conv = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, s.k1, C);
    g.w    = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, s.k1 + 1, C);
    g.bias = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, s.hv);
    g.a    = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, s.hv);
    const size_t es = sizeof(float);
    ggml_tensor * qkv   = ggml_view_2d(ctx, g.y, C, n, g.y->nb[1], 0);
    ggml_tensor * beta  = ggml_view_2d(ctx, g.y, s.hv, n, g.y->nb[1], (C + (int64_t) s.hv*s.S)*es);
    ggml_tensor * alpha = ggml_view_2d(ctx, g.y, s.hv, n, g.y->nb[1], (C + (int64_t) s.hv*s.S + s.hv)*es);
    g.P = ggml_pyqwen_deltanet_prep(ctx, qkv, beta, alpha, g.conv, g.w, g.bias, g.a, s.hk, 1e-6f);
    return g;
}

static void set_prep(const prep_graph & g, const std::vector<float> & y, const std::vector<float> & conv,
                     const std::vector<float> & w, const std::vector<float> & bias, const std::vector<float> & a) {
    ggml_backend_tensor_set(g.y, y.data(), 0, y.size()*sizeof(float));
    ggml_backend_tensor_set(g.conv, conv.data(), 0, conv.size()*sizeof(float));
    ggml_backend_tensor_set(g.w, w.data(), 0, w.size()*sizeof(float));
    ggml_backend_tensor_set(g.bias, bias.data(), 0, bias.size()*sizeof(float));
    ggml_backend_tensor_set(g.a, a.data(), 0, a.size()*sizeof(float));
}

// The prep alone: its output, and the conv state it advanced in place.
static prep_result run_prep(ggml_backend_t backend, const prep_shape & s, int n, const std::vector<float> & y,
                            const std::vector<float> & state, const std::vector<float> & w,
                            const std::vector<float> & bias, const std::vector<float> & a) {
    ggml_init_params ip = { 16*ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true };
    ggml_context * ctx = ggml_init(ip);
    const prep_graph g = build_prep(ctx, s, n);
    ggml_tensor * P = g.P;
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, P);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, backend);
    set_prep(g, y, state, w, bias, a);
    const size_t es = sizeof(float);
    const std::vector<float> poison(ggml_nelements(P), NAN);
    ggml_backend_tensor_set(P, poison.data(), 0, poison.size()*es);
    if (!ggml_backend_supports_op(backend, P)) { fprintf(stderr, "DELTANET_PREP unsupported\n"); std::exit(2); }
    ggml_backend_graph_compute(backend, gf);
    prep_result r;
    r.out.resize(ggml_nelements(P));
    r.state.resize(state.size());
    ggml_backend_tensor_get(P, r.out.data(), 0, r.out.size()*es);
    ggml_backend_tensor_get(g.conv, r.state.data(), 0, r.state.size()*es);
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    return r;
}

struct step_result {
    std::vector<float> attn, state, conv;
};

// The whole step as pyqwen's graph builds a decode or verify pass (pq-graph.c): the prep, then
// ggml_gated_delta_net over views of its output, and the new state copied back onto the old. The CUDA
// backend runs it as one kernel where it can (heads of 128, up to 8 tokens), else as the two ops.
static step_result run_step(ggml_backend_t backend, const prep_shape & s, int n, const std::vector<float> & y,
                            const std::vector<float> & conv, const std::vector<float> & w, const std::vector<float> & bias,
                            const std::vector<float> & a, const std::vector<float> & state) {
    const int64_t C = (int64_t) (2*s.hk + s.hv)*s.S, D = (int64_t) s.S*s.S*s.hv;
    ggml_init_params ip = { 32*ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true };
    ggml_context * ctx = ggml_init(ip);
    const prep_graph pg = build_prep(ctx, s, n);
    ggml_tensor * P  = pg.P;
    ggml_tensor * ST = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, s.S, s.S, s.hv, 1);
    const size_t es = sizeof(float);
    ggml_tensor * q = ggml_view_4d(ctx, P, s.S, s.hk, n, 1, s.S*es, C*es, C*n*es, 0);
    ggml_tensor * k = ggml_view_4d(ctx, P, s.S, s.hk, n, 1, s.S*es, C*es, C*n*es, (size_t) s.S*s.hk*es);
    ggml_tensor * v = ggml_view_4d(ctx, P, s.S, s.hv, n, 1, s.S*es, C*es, C*n*es, (size_t) 2*s.S*s.hk*es);
    ggml_tensor * g = ggml_view_1d(ctx, P, (int64_t) s.hv*n, C*n*es);
    ggml_tensor * b = ggml_view_1d(ctx, P, (int64_t) s.hv*n, (C + s.hv)*n*es);
    ggml_tensor * out = ggml_gated_delta_net(ctx, q, k, v, ggml_reshape_4d(ctx, g, 1, s.hv, n, 1),
                                             ggml_reshape_4d(ctx, b, 1, s.hv, n, 1), ST, 1);
    ggml_tensor * attn = ggml_view_3d(ctx, out, s.S, s.hv, n, s.S*es, (size_t) s.S*s.hv*es, 0);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, ggml_cpy(ctx, ggml_view_1d(ctx, out, D, (size_t) s.S*s.hv*n*es),
                                           ggml_view_3d(ctx, ST, D, 1, 1, D*es, D*es, 0)));
    ggml_build_forward_expand(gf, attn);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, backend);
    set_prep(pg, y, conv, w, bias, a);
    ggml_backend_tensor_set(ST, state.data(), 0, state.size()*es);
    const std::vector<float> poison(ggml_nelements(out), NAN);
    ggml_backend_tensor_set(out, poison.data(), 0, poison.size()*es);
    ggml_backend_graph_compute(backend, gf);
    step_result r;
    r.attn.resize((size_t) s.S*s.hv*n);
    r.state.resize(state.size());
    r.conv.resize(conv.size());
    ggml_backend_tensor_get(out, r.attn.data(), 0, r.attn.size()*es);
    ggml_backend_tensor_get(ST, r.state.data(), 0, r.state.size()*es);
    ggml_backend_tensor_get(pg.conv, r.conv.data(), 0, r.conv.size()*es);
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    return r;
}

// max |a - b| / (|b| + floor) over the values, and whether a is all finite
static double max_rel(const std::vector<float> & a, const std::vector<float> & b, double floor, bool & finite) {
    double err = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        finite = finite && std::isfinite(a[i]);
        err = std::fmax(err, std::fabs((double) a[i] - b[i])/(std::fabs((double) b[i]) + floor));
    }
    return err;
}

int main() {
    ggml_backend_t cpu = ggml_backend_cpu_init(), gpu = ggml_backend_cuda_init(0);
    if (!gpu) { fprintf(stderr, "no CUDA device\n"); return 2; }
    std::mt19937 rng(std::random_device{}());
    std::normal_distribution<float> nd;
    const auto randn = [&](size_t count, float scale) {
        std::vector<float> v(count);
        for (float & x : v) x = scale*nd(rng);
        return v;
    };
    // a layer's prep inputs for n tokens: y rows, conv state, conv weights, dt_bias, a = -exp(A_log)
    struct layer { std::vector<float> y, conv, w, bias, a; };
    const auto random_layer = [&](const prep_shape & s, int n) {
        const int64_t C = (int64_t) (2*s.hk + s.hv)*s.S, W = C + (int64_t) s.hv*s.S + 2*s.hv;
        layer L = { randn((size_t) W*n, 1.0f), randn((size_t) s.k1*C, 1.0f), randn((size_t) (s.k1 + 1)*C, 0.5f),
                    randn(s.hv, 1.0f), randn(s.hv, 1.0f) };
        for (float & x : L.a) x = -std::exp(x);
        return L;
    };
    int passed = 0, failed = 0;
    // the last: a head that is not a whole number of warps, a conv kernel of 6
    const prep_shape shapes[] = { {16, 32, 128, 3}, {1, 4, 16, 3}, {2, 6, 64, 3}, {3, 5, 40, 5} };
    for (const prep_shape & s : shapes) {
        for (int n : {1, 2, 3, 5, 8, 9, 17}) { // 9 and 17: the CUDA kernel's token groups of 8
            const layer L = random_layer(s, n);
            const prep_result g = run_prep(gpu, s, n, L.y, L.conv, L.w, L.bias, L.a);
            const prep_result c = run_prep(cpu, s, n, L.y, L.conv, L.w, L.bias, L.a);
            bool finite = true;
            const double err = max_rel(g.out, c.out, 1e-3, finite);
            const bool same_state = g.state == c.state;
            // the same float steps; the CUDA build's fast-math exp and a float (CPU: double) norm sum differ by ulps
            const bool ok = finite && same_state && err < 1e-4;
            (ok ? passed : failed)++;
            printf("hk=%2d hv=%2d S=%3d k1=%d n=%2d  max rel err vs CPU %.2e  conv state %s  %s\n", s.hk, s.hv, s.S, s.k1, n, err,
                   same_state ? "same bits" : "DIFFERENT", ok ? "ok" : "FAIL");
        }
    }
    // the whole step; the first three shapes take the CUDA step kernel up to 8 tokens (v heads sharing a k
    // head: 2, 1, 4), the last two the two ops, as does every pass of 9 tokens (ggml's CUDA recurrence takes
    // heads of 16, 32, 64 and 128 channels only)
    const prep_shape step_shapes[] = { {16, 32, 128, 3}, {2, 2, 128, 3}, {1, 4, 128, 5}, {2, 6, 64, 3}, {3, 6, 32, 5} };
    for (const prep_shape & s : step_shapes) {
        for (int n : {1, 2, 3, 8, 9}) {
            const layer L = random_layer(s, n);
            const std::vector<float> state = randn((size_t) s.S*s.S*s.hv, 0.1f);
            const step_result g = run_step(gpu, s, n, L.y, L.conv, L.w, L.bias, L.a, state);
            const step_result c = run_step(cpu, s, n, L.y, L.conv, L.w, L.bias, L.a, state);
            bool finite = true;
            const double e_attn = max_rel(g.attn, c.attn, 1e-2, finite), e_state = max_rel(g.state, c.state, 1e-2, finite);
            const bool same_conv = g.conv == c.conv;
            // float sums in other orders (a column's 128 rows over 8 threads; ggml's over a warp)
            const bool ok = finite && same_conv && e_attn < 1e-4 && e_state < 1e-4;
            (ok ? passed : failed)++;
            printf("step hk=%2d hv=%2d S=%3d k1=%d n=%2d  max rel err vs CPU: outputs %.2e, state %.2e  conv state %s  %s\n",
                   s.hk, s.hv, s.S, s.k1, n, e_attn, e_state, same_conv ? "same bits" : "DIFFERENT", ok ? "ok" : "FAIL");
        }
    }
    printf("%d passed, %d failed\n", passed, failed);
    ggml_backend_free(gpu); ggml_backend_free(cpu);
    return failed == 0 ? 0 : 1;
}
