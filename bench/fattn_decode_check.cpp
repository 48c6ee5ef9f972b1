// GGML_OP_FLASH_ATTN_EXT for decode and verify passes on a CUDA device (pyqwen_fattn_decode where it applies,
// patch 0009) against ggml's CPU backend, through ggml's public API, with the graph pyqwen builds
// (pq-graph.c): the query heads permuted to [D, rows, heads], K and V views of f16 caches [D*kv_heads, n_ctx],
// a f16 mask of the visible positions (a view of one row for one token, causal rows for more), the output
// poisoned with NaN first. Shapes: the 9B model's attention (16 query heads, 4 kv heads of 256), heads of 128
// with 1 and 8 query heads a kv head; 1, 3, 5, 8 and 9 rows (tokens) and depths 1..4096 (on the H200, 3100: the
// 9B shape's 97 splits; 4096 with one kv head of 128: 128, the most). Rows times query heads a kv head up to 16
// take one m-tile of the kernel, up to 32 two; past that (the 9B shape's 9 rows, 5 rows at 8 heads a kv head)
// upstream's kernels run. Both sides round the queries to f16 for the K products, the GPU its weights too for
// the V sums; they differ by about 1e-3.
// Built and run by bench/cuda_ops_check.sh; exit code non-zero on any failure.
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml-cuda.h"

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

struct attn_shape { int n_head, n_head_kv, D; };

static std::vector<float> run_attn(ggml_backend_t backend, const attn_shape & s, int n, int n_kv, int n_ctx,
                                   const std::vector<float> & q, const std::vector<ggml_fp16_t> & kc,
                                   const std::vector<ggml_fp16_t> & vc, const std::vector<ggml_fp16_t> & mask) {
    ggml_init_params ip = { 16*ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true };
    ggml_context * ctx = ggml_init(ip);
    const size_t es = sizeof(ggml_fp16_t);
    ggml_tensor * Q  = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, s.D, s.n_head, n);
    ggml_tensor * KC = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, (int64_t) s.D*s.n_head_kv, n_ctx);
    ggml_tensor * VC = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, (int64_t) s.D*s.n_head_kv, n_ctx);
    ggml_tensor * M  = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, n_kv, n);
    ggml_tensor * K = ggml_view_3d(ctx, KC, s.D, n_kv, s.n_head_kv, KC->nb[1], s.D*es, 0);
    ggml_tensor * V = ggml_view_3d(ctx, VC, s.D, n_kv, s.n_head_kv, VC->nb[1], s.D*es, 0);
    ggml_tensor * mask_in = n == 1 ? ggml_view_1d(ctx, M, n_kv, 0) : M;
    ggml_tensor * out = ggml_flash_attn_ext(ctx, ggml_permute(ctx, Q, 0, 2, 1, 3), K, V, mask_in, 1.0f/std::sqrt((float) s.D), 0.0f, 0.0f);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, backend);
    ggml_backend_tensor_set(Q, q.data(), 0, q.size()*sizeof(float));
    ggml_backend_tensor_set(KC, kc.data(), 0, kc.size()*es);
    ggml_backend_tensor_set(VC, vc.data(), 0, vc.size()*es);
    ggml_backend_tensor_set(M, mask.data(), 0, mask.size()*es);
    const std::vector<float> poison(ggml_nelements(out), NAN);
    ggml_backend_tensor_set(out, poison.data(), 0, poison.size()*sizeof(float));
    if (!ggml_backend_supports_op(backend, out)) { fprintf(stderr, "FLASH_ATTN_EXT unsupported\n"); std::exit(2); }
    ggml_backend_graph_compute(backend, gf);
    std::vector<float> y(ggml_nelements(out));
    ggml_backend_tensor_get(out, y.data(), 0, y.size()*sizeof(float));
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    return y;
}

int main() {
    ggml_backend_t cpu = ggml_backend_cpu_init(), gpu = ggml_backend_cuda_init(0);
    if (!gpu) { fprintf(stderr, "no CUDA device\n"); return 2; }
    std::mt19937 rng(std::random_device{}());
    std::normal_distribution<float> nd;
    std::uniform_real_distribution<float> ud;
    int passed = 0, failed = 0;
    const attn_shape shapes[] = { {16, 4, 256}, {8, 8, 128}, {8, 1, 128} };
    for (const attn_shape & s : shapes) {
        for (int n_kv : {1, 100, 1000, 3100, 4096}) {
            for (int n : {1, 3, 5, 8, 9}) {
                if (n_kv < n) { // a pass's rows see their own positions: no row is wholly masked
                    continue;
                }
                const int n_ctx = n_kv + 16; // positions past n_kv hold other data, which the views leave out
                std::vector<float> q((size_t) s.D*s.n_head*n);
                for (float & x : q) x = nd(rng);
                std::vector<ggml_fp16_t> kc((size_t) s.D*s.n_head_kv*n_ctx), vc(kc.size()), mask((size_t) n_kv*n);
                for (auto & x : kc) x = ggml_fp32_to_fp16(nd(rng));
                for (auto & x : vc) x = ggml_fp32_to_fp16(nd(rng));
                for (int i = 0; i < n; ++i) { // causal over the last rows, a few positions masked at random
                    for (int p = 0; p < n_kv; ++p) {
                        const bool masked = p > n_kv - n + i || (p > 0 && ud(rng) < 0.05f);
                        mask[(size_t) i*n_kv + p] = ggml_fp32_to_fp16(masked ? -INFINITY : 0.0f);
                    }
                }
                const std::vector<float> g = run_attn(gpu, s, n, n_kv, n_ctx, q, kc, vc, mask);
                const std::vector<float> c = run_attn(cpu, s, n, n_kv, n_ctx, q, kc, vc, mask);
                double e2 = 0, r2 = 0;
                bool finite = true;
                for (size_t i = 0; i < g.size(); ++i) {
                    finite = finite && std::isfinite(g[i]);
                    e2 += ((double) g[i] - c[i])*((double) g[i] - c[i]);
                    r2 += (double) c[i]*c[i];
                }
                const double rel = std::sqrt(e2/std::fmax(r2, 1e-30));
                const bool ok = finite && rel < 1e-2;
                (ok ? passed : failed)++;
                printf("heads %2d/%d D=%3d n_kv=%4d rows=%d  rel_l2 vs CPU %.2e  %s\n", s.n_head, s.n_head_kv, s.D, n_kv, n, rel, ok ? "ok" : "FAIL");
            }
        }
    }
    printf("%d passed, %d failed\n", passed, failed);
    ggml_backend_free(gpu); ggml_backend_free(cpu);
    return failed == 0 ? 0 : 1;
}
