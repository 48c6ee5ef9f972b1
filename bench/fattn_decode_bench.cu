// pyqwen_fattn_decode and pyqwen_fattn_combine (ggml-patches/src/src/ggml-cuda/pyqwen-fattn-kernel.cuh) on their
// own: against a float64 reference of ggml's FLASH_ATTN_EXT (softmax(scale Q K^T + mask) V, query head j reading
// kv head j/G) on random queries and f16 caches, with masked positions, for 1..8 query rows (4 heads each: 4..32 rows, one m-tile or two) and
// depths up to 8192 (3100: 97 splits on the H200), outputs poisoned first; then the 9B shape's 8 attention
// layers (16 query heads, 4 kv heads of 256), each reading its own cache, timed in a CUDA graph, launched
// without and with PDL, at depths 512, 8192, 8448 (pyqwen's span at depth 8192) and 32640, 1, 2, 4 and 8 query rows
// (a decode token, verify passes), to set
// beside upstream's 8.9 + 2.8 us a layer at depth 512 (the census). -DPFA_STAGES and -DPFA_MAX_SPLITS build
// other sizes. Builds in seconds from the patched tree:
//   G=vendor/ggml; nvcc -std=c++17 -O3 -arch=sm_90 -use_fast_math -extended-lambda -I$G/include -I$G/src \
//     -I$G/src/ggml-cuda -DGGML_USE_CUDA bench/fattn_decode_bench.cu -o /tmp/fattn_decode_bench
#include "pyqwen-fattn-kernel.cuh"
#include "cuda_graph_time.cuh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

// stand-ins: CUDA_CHECK's error path and the device query of ggml_cuda_kernel_launch live in ggml-cuda.cu
void ggml_cuda_error(const char * stmt, const char * func, const char * file, int line, const char * msg) {
    fprintf(stderr, "CUDA error: %s\n  %s in %s at %s:%d\n", msg, stmt, func, file, line);
    exit(1);
}
int ggml_cuda_get_device() { return 0; }

struct attn_shape { int n_head, n_head_kv, D; };

// values in [-2, 2) from a hash of the index: the timed caches, too big to draw on the host
static __global__ void fill_random(half * x, const size_t n, const unsigned seed) {
    for (size_t i = blockIdx.x*(size_t) blockDim.x + threadIdx.x; i < n; i += (size_t) gridDim.x*blockDim.x) {
        unsigned h = (unsigned) i*2654435761u ^ seed*0x9E3779B9u;
        h ^= h >> 15;
        h *= 0x85EBCA6Bu;
        h ^= h >> 13;
        x[i] = __float2half((float) (h >> 8)*(4.0f/16777216.0f) - 2.0f);
    }
}

// the two kernels, as pyqwen-fattn-decode.cu launches them (pfa_launch), with programmatic dependent launch (on
// Hopper, unless GGML_CUDA_PDL=0) or, pdl false, without
template <int D>
static void launch(const pfa_args & a, int nsplit, cudaStream_t st, bool pdl = false) {
    const int rows = a.n_head/a.n_head_kv*a.n_q;
    ggml_cuda_pdl_off = !pdl;
    if (pfa_m_tiles(rows) == 1) {
        pfa_launch<D, 1>(a, nsplit, rows, st);
    } else {
        pfa_launch<D, 2>(a, nsplit, rows, st);
    }
    ggml_cuda_pdl_off = false;
}

struct device_buf {
    void * p = nullptr;
    explicit device_buf(size_t bytes) { CUDA_CHECK(cudaMalloc(&p, bytes)); }
    ~device_buf() { cudaFree(p); }
    template <typename T> T * as() const { return (T *) p; }
};

int main() {
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    cudaStream_t st;
    CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    std::mt19937 rng(3);
    std::normal_distribution<float> nd;
    std::uniform_real_distribution<float> ud;
    const attn_shape sh = {16, 4, 256};
    const int D = sh.D, n_check = 8192, n_ctx = 32768; // the checks' deepest cache; a timed layer's
    const int nsm = prop.multiProcessorCount, ctas_mt[3] = {0, pfa_occupancy<256, 1>(), pfa_occupancy<256, 2>()};
    int passed = 0, failed = 0;

    // the checks' cache: n_check positions of n_head_kv heads, as pyqwen's [D*n_head_kv, n_ctx] f16 tensors
    // (the timed layers read caches of their own, filled on the device)
    const int64_t kv_pos = (int64_t) D*sh.n_head_kv, kv_head = D;
    std::vector<half> hk((size_t) n_check*kv_pos), hv(hk.size());
    for (size_t i = 0; i < hk.size(); ++i) {
        hk[i] = __float2half(nd(rng));
        hv[i] = __float2half(nd(rng));
    }
    device_buf dk(hk.size()*sizeof(half)), dv(hv.size()*sizeof(half));
    CUDA_CHECK(cudaMemcpy(dk.p, hk.data(), hk.size()*sizeof(half), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dv.p, hv.data(), hv.size()*sizeof(half), cudaMemcpyHostToDevice));
    device_buf partial(pfa_partial_floats(D, sh.n_head_kv, PFA_MAX_SPLITS, PFA_MAX_ROWS)*sizeof(float));

    for (int n_kv : {1, 37, 512, 3100, n_check}) {
        for (int n_q = 1; n_q*sh.n_head/sh.n_head_kv <= PFA_MAX_ROWS; ++n_q) {
            std::vector<float> q((size_t) n_q*sh.n_head*D);
            for (float & x : q) x = nd(rng);
            // a causal tail over the last rows, and a few positions masked at random
            std::vector<half> mask((size_t) n_q*n_kv);
            for (int i = 0; i < n_q; ++i) {
                for (int p = 0; p < n_kv; ++p) {
                    const bool masked = p > n_kv - n_q + i || (p > 0 && ud(rng) < 0.05f);
                    mask[(size_t) i*n_kv + p] = __float2half(masked ? -INFINITY : 0.0f);
                }
            }
            const float scale = 1.0f/std::sqrt((float) D);
            // float64 reference
            std::vector<double> want((size_t) n_q*sh.n_head*D);
            for (int i = 0; i < n_q; ++i) {
                for (int j = 0; j < sh.n_head; ++j) {
                    const int h = j/(sh.n_head/sh.n_head_kv);
                    std::vector<double> s(n_kv);
                    double m = -INFINITY;
                    for (int p = 0; p < n_kv; ++p) {
                        double dot = 0;
                        for (int d = 0; d < D; ++d) dot += (double) q[((size_t) i*sh.n_head + j)*D + d]*__half2float(hk[p*kv_pos + h*kv_head + d]);
                        s[p] = dot*scale + __half2float(mask[(size_t) i*n_kv + p]);
                        m = std::max(m, s[p]);
                    }
                    double l = 0;
                    std::vector<double> o(D, 0.0);
                    for (int p = 0; p < n_kv && m != -INFINITY; ++p) {
                        const double w = std::exp(s[p] - m);
                        l += w;
                        for (int d = 0; d < D; ++d) o[d] += w*__half2float(hv[p*kv_pos + h*kv_head + d]);
                    }
                    for (int d = 0; d < D; ++d) want[((size_t) i*sh.n_head + j)*D + d] = l > 0 ? o[d]/l : 0.0;
                }
            }
            device_buf dq(q.size()*sizeof(float)), dm(mask.size()*sizeof(half)), dout(want.size()*sizeof(float));
            CUDA_CHECK(cudaMemcpy(dq.p, q.data(), q.size()*sizeof(float), cudaMemcpyHostToDevice));
            CUDA_CHECK(cudaMemcpy(dm.p, mask.data(), mask.size()*sizeof(half), cudaMemcpyHostToDevice));
            CUDA_CHECK(cudaMemset(dout.p, 0xFF, want.size()*sizeof(float))); // NaN
            const int chunk = pfa_chunk(n_kv, sh.n_head_kv, nsm, ctas_mt[pfa_m_tiles(n_q*sh.n_head/sh.n_head_kv)]);
            const int nsplit = (n_kv + chunk - 1)/chunk;
            const pfa_args a = { dq.as<float>(), (int64_t) sh.n_head*D, D, dk.as<half>(), dv.as<half>(), kv_pos, kv_head,
                                 dm.as<half>(), n_kv, dout.as<float>(), (int64_t) sh.n_head*D, D, partial.as<float>(),
                                 n_q, n_kv, sh.n_head, sh.n_head_kv, chunk, scale };
            launch<256>(a, nsplit, st);
            CUDA_CHECK(cudaStreamSynchronize(st));
            CUDA_CHECK(cudaGetLastError());
            std::vector<float> got(want.size());
            CUDA_CHECK(cudaMemcpy(got.data(), dout.p, got.size()*sizeof(float), cudaMemcpyDeviceToHost));
            double err = 0, ref2 = 0;
            bool finite = true;
            for (size_t e = 0; e < got.size(); ++e) {
                finite = finite && std::isfinite(got[e]);
                err += (got[e] - want[e])*(got[e] - want[e]);
                ref2 += want[e]*want[e];
            }
            const double rel = std::sqrt(err/std::max(ref2, 1e-30));
            const bool ok = finite && rel < 1e-3; // f16 q and weights into the tensor cores, f32 sums, fast-math exp
            (ok ? passed : failed)++;
            printf("%s n_kv=%5d n_q=%d: %d splits of %d, rel_l2 vs float64 %.2e\n", ok ? "ok  " : "FAIL", n_kv, n_q, nsplit, chunk, rel);
        }
    }

    // 8 layers (the 9B shape's attention layers), each its own cache of n_ctx positions (8 x 64 MB: nothing is
    // left in the L2 from the layer before, as in the model), one graph; pfa_chunk's split, for as many CTAs as
    // fit an SM, and for fewer, to tune it by
    const int layers = 8;
    device_buf lk((size_t) layers*n_ctx*kv_pos*sizeof(half)), lv((size_t) layers*n_ctx*kv_pos*sizeof(half));
    fill_random<<<1024, 256, 0, st>>>(lk.as<half>(), (size_t) layers*n_ctx*kv_pos, 1u);
    fill_random<<<1024, 256, 0, st>>>(lv.as<half>(), (size_t) layers*n_ctx*kv_pos, 2u);
    CUDA_CHECK(cudaGetLastError());
    printf("\nPFA_STAGES %d, PFA_MAX_SPLITS %d; one m-tile: %d KB of shared memory a CTA, %d CTAs an SM; two: %d KB, %d\n",
           PFA_STAGES, PFA_MAX_SPLITS, (int) (pfa_smem(D, 1)/1024), ctas_mt[1], (int) (pfa_smem(D, 2)/1024), ctas_mt[2]);
    printf("\n| depth | query rows | splits for CTAs an SM | us a layer (8 layers in a graph) | with PDL | K and V read with PDL, GB/s | splits |\n|---|---|---|---|---|---|---|\n");
    for (int n_kv : {512, 8192, 8448, 32640}) { // 8448: pyqwen's span at depth 8192 and up (steps of 256)
        for (int n_q : {1, 2, 4, 8}) { // a decode token, and verify passes
            // the occupancy's split (pfa_chunk's), then fewer CTAs an SM to compare
            const int ctas = ctas_mt[pfa_m_tiles(n_q*sh.n_head/sh.n_head_kv)];
            std::vector<int> cta_counts = {ctas};
            for (const int c : {2, 1}) {
                if (c < ctas) {
                    cta_counts.push_back(c);
                }
            }
            for (const int c : cta_counts) {
                const int chunk = pfa_chunk(n_kv, sh.n_head_kv, nsm, c);
                const int nsplit = (n_kv + chunk - 1)/chunk;
                if (nsplit > PFA_MAX_SPLITS) {
                    continue; // the kernel's bound
                }
                device_buf dq((size_t) n_q*sh.n_head*D*sizeof(float)), dout((size_t) n_q*sh.n_head*D*sizeof(float));
                device_buf dm((size_t) n_q*n_kv*sizeof(half)); // every position visible, but read as the model's mask is
                CUDA_CHECK(cudaMemset(dq.p, 0, (size_t) n_q*sh.n_head*D*sizeof(float)));
                CUDA_CHECK(cudaMemset(dm.p, 0, (size_t) n_q*n_kv*sizeof(half)));
                double us[2];
                for (const bool pdl : {false, true}) {
                    us[pdl] = graph_us_per_replay(st, 100, [&] {
                        for (int l = 0; l < layers; ++l) {
                            const int64_t off = (int64_t) l*n_ctx*kv_pos;
                            const pfa_args a = { dq.as<float>(), (int64_t) sh.n_head*D, D, lk.as<half>() + off, lv.as<half>() + off, kv_pos, kv_head,
                                                 dm.as<half>(), n_kv, dout.as<float>(), (int64_t) sh.n_head*D, D, partial.as<float>(),
                                                 n_q, n_kv, sh.n_head, sh.n_head_kv, chunk, 1.0f/16.0f };
                            launch<256>(a, nsplit, st, pdl);
                        }
                    })/layers;
                }
                const double bytes = 2.0*n_kv*kv_pos*sizeof(half);
                printf("| %d | %d | %d%s | %.2f | %.2f | %.0f | %d of %d |\n", n_kv, n_q, c, c == ctas ? " (pfa_chunk's)" : "",
                       us[0], us[1], bytes/us[1]*1e-3, nsplit, chunk);
            }
        }
    }
    printf("\n%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
