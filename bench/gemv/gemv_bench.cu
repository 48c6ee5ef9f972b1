// Device harness of the interleaved skinny GEMV (gemv-il.cuh): correctness against a float64 CPU
// reference, then timings inside CUDA graphs with weights rotated over more than the L2, next to
// upstream ggml's quantize_q8_1 + mul_mat_vec_q on the same shapes. bench/gemv/run.sh builds and runs it.
//
//   gemv_bench [--quick] [TYPE]  --quick: correctness of the small shapes only; TYPE: that type only
//   gemv_bench --token TYPE [SHAPE]  one decode token's GEMVs of the 9B (or 27b) shape in TYPE (q4_0, q4_k,
//                             q8_0, w4a8; the head Q6_K), each after its quantization, back to back in one CUDA graph
//   built with -DGEMV_TIMELINE, GEMV_TOKEN_TIMELINE=1: also where that token's time goes, GEMV by GEMV
//                             (gemv_timeline.cuh): each one's start, wait for the kernel before, body and tail
#ifdef GEMV_TIMELINE
#include "gemv_timeline.cuh"
#endif
#include "gemv-il.cuh"
#include "gemv_ref.h"

#ifdef GEMV_BENCH_UPSTREAM
#include "mmvq.cuh"
#include "quantize.cuh"
#endif

#include <cstdarg>
#include <cstdio>
#include <string>

// ---- the few ggml-base / ggml-cuda symbols the CUDA sources above need, for this standalone build ----

static cudaDeviceProp g_prop;

const ggml_cuda_device_info & ggml_cuda_info() {
    static ggml_cuda_device_info info = [] {
        ggml_cuda_device_info i = {};
        i.device_count = i.physical_device_count = 1;
        i.devices[0].cc        = 100*g_prop.major + 10*g_prop.minor;
        i.devices[0].nsm       = g_prop.multiProcessorCount;
        i.devices[0].smpb      = g_prop.sharedMemPerBlock;
        i.devices[0].smpbo     = g_prop.sharedMemPerBlockOptin;
        i.devices[0].warp_size = g_prop.warpSize;
        return i;
    }();
    return info;
}
int  ggml_cuda_get_device() { return 0; }
void ggml_cuda_set_device(int) {}
void ggml_cuda_error(const char * stmt, const char * func, const char * file, int line, const char * msg) {
    fprintf(stderr, "CUDA error: %s\n  %s in %s at %s:%d\n", msg, stmt, func, file, line);
    exit(1);
}
void ggml_abort(const char * file, int line, const char * fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "abort at %s:%d: ", file, line);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}
// the types of the harness, in the order they are checked and timed
static const int gemv_types[] = {GEMV_IL_Q4_0, GEMV_IL_Q4_K, GEMV_IL_Q6_K, GEMV_IL_Q8_0, GEMV_IL_W4A8};
static ggml_type ggml_type_of(int type) {
    const ggml_type t[] = {GGML_TYPE_Q4_0, GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, GGML_TYPE_PQ_W4A8};  // by gemv_il_type
    return t[type];
}
int64_t ggml_blck_size(enum ggml_type type) {
    for (int t : gemv_types) if (ggml_type_of(t) == type) return gemv_il_block_k(t);
    GGML_ABORT("type %d", (int) type);
}
size_t ggml_type_size(enum ggml_type type) {
    for (int t : gemv_types) if (ggml_type_of(t) == type) return gemv_il_block_bytes(t);
    GGML_ABORT("type %d", (int) type);
}
// referenced by upstream's whole-op entry points, which this harness does not call
bool    ggml_is_quantized(enum ggml_type)                                      { GGML_ABORT("unused"); }
bool    ggml_is_contiguous(const ggml_tensor *)                                { GGML_ABORT("unused"); }
bool    ggml_is_contiguously_allocated(const ggml_tensor *)                    { GGML_ABORT("unused"); }
bool    ggml_are_same_stride(const ggml_tensor *, const ggml_tensor *)        { GGML_ABORT("unused"); }
size_t  ggml_nbytes(const ggml_tensor *)                                       { GGML_ABORT("unused"); }
int64_t ggml_nelements(const ggml_tensor *)                                    { GGML_ABORT("unused"); }
size_t  ggml_backend_buffer_get_alloc_size(ggml_backend_buffer_t, const ggml_tensor *) { GGML_ABORT("unused"); }
enum ggml_backend_buffer_usage ggml_backend_buffer_get_usage(ggml_backend_buffer_t)    { GGML_ABORT("unused"); }
std::unique_ptr<ggml_cuda_pool> ggml_backend_cuda_context::new_pool_for_device(int, int) { GGML_ABORT("unused"); }

// ---- harness ----

static const char * type_name(int type) {
    const char * names[] = {"q4_0", "q8_0", "q4_k", "q6_k", "w4a8"};  // by gemv_il_type
    return names[type];
}

struct dev_buf {
    void * p = nullptr;
    explicit dev_buf(size_t n) { CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 16))); }
    ~dev_buf() { cudaFree(p); }
    template <typename T> T * as() const { return (T *) p; }
};

// The activation quantization of m rows of x (k wide, stride_x apart), with a prologue (gemv_il_prologue).
static void launch_quantize(const float * x, int64_t stride_x, int k, int m, uint8_t * xq, float * xs, cudaStream_t st,
                            gemv_il_prologue prologue = GEMV_IL_PLAIN, const gemv_il_prologue_args & args = {}) {
    ggml_cuda_kernel_launch(gemv_il_quantize_kernel(prologue), ggml_cuda_kernel_launch_params(dim3(k/32), dim3(GEMV_IL_MAX_TOKENS*WARP_SIZE), 0, st),
                            x, stride_x, m, xq, xs, args);
}

// The kernel variants built here: (type, register stages S); gemv_il_stages(type) is pyqwen's choice.
using gemv_kernel_t = void (*)(const uint8_t *, const int8_t * const *, const uint8_t *, const float *, float *, int, int, int, int64_t, gemv_il_epilogue);
static gemv_kernel_t gemv_kernel(int type, int s) {
    return gemv_il_dispatch(type, [s](auto t) -> gemv_kernel_t {
        constexpr int type = decltype(t)::value;
        return s == 1 ? gemv_il_mul_mat<type, 1> : s == 2 ? gemv_il_mul_mat<type, 2> : s == 3 ? gemv_il_mul_mat<type, 3> : gemv_il_mul_mat<type, 4>;
    });
}
static const std::vector<int> gemv_stages = {1, 2, 3, 4};

// W4A8's level tables on the device, by codebook id, as pyqwen's (gemv-il-ggml.cu): every id gemv_ref.h's
// codebook, which ref_mul_mat decodes with (the token bench's weights are a byte pattern, ids included)
static const int8_t * const * device_w4a8_luts() {
    static const int8_t * const * luts = [] {
        void * levels, * ptrs;
        CUDA_CHECK(cudaMalloc(&levels, 256*16));
        CUDA_CHECK(cudaMemcpy(levels, ref_w4a8_levels(), 256*16, cudaMemcpyHostToDevice));
        const std::vector<const int8_t *> host(GEMV_IL_W4A8_CODEBOOKS, (const int8_t *) levels);
        CUDA_CHECK(cudaMalloc(&ptrs, host.size()*sizeof(host[0])));
        CUDA_CHECK(cudaMemcpy(ptrs, host.data(), host.size()*sizeof(host[0]), cudaMemcpyHostToDevice));
        return (const int8_t * const *) ptrs;
    }();
    return luts;
}

// W4A8 rows (interleaved full tiles, then the partial tile's ggml rows) -> Q8_0 rows, as pyqwen's prefill
static void launch_w4a8_to_q8_0(const uint8_t * w, uint8_t * q8, int k, int n, cudaStream_t st) {
    const int G = gemv_il_deinterleave_chunks(GEMV_IL_W4A8);
    gemv_il_w4a8_to_q8_0<<<dim3((n + 15)/16, (k/GEMV_IL_CHUNK_K + G - 1)/G), 256, 0, st>>>(w, q8, device_w4a8_luts(), k, n);
    CUDA_CHECK(cudaGetLastError());
}

// CTAs of one kernel variant and split resident on an SM at once
static int ctas_per_sm(int type, int u, int nwarps) {
    int c = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&c, gemv_kernel(type, u), nwarps*WARP_SIZE, 0));
    return c;
}

// ctas: the grid, pyqwen's (gemv_il_grid) unless given (a type of tile loops only)
static void launch_gemv(int type, int u, const uint8_t * w, const uint8_t * xq, const float * xs, float * y, int n, int k, int m, int nwarps,
                        cudaStream_t st, const gemv_il_epilogue & ep = {}, int ctas = 0) {
    const int grid = ctas > 0 ? ctas : gemv_il_grid(type, n, (int64_t) ctas_per_sm(type, u, nwarps)*g_prop.multiProcessorCount);
    const ggml_cuda_kernel_launch_params p(dim3(grid), dim3(nwarps*WARP_SIZE), 0, st);
    const int8_t * const * luts = type == GEMV_IL_W4A8 ? device_w4a8_luts() : nullptr;
    ggml_cuda_kernel_launch(gemv_kernel(type, u), p, w, luts, xq, xs, y, n, k, m, (int64_t) n, ep);
}

// upstream has no kernel for pyqwen's W4A8 (pyqwen expands it to Q8_0 there: compare with the Q8_0 rows)
static bool upstream_has(int type) { return type != GEMV_IL_W4A8; }

static int pick_nwarps(int type, int64_t n, int64_t k) {
    return gemv_il_pick_nwarps(n, k, gemv_il_stages(type), g_prop.multiProcessorCount,
                               [type](int nw) { return ctas_per_sm(type, gemv_il_stages(type), nw); });
}

#ifdef GEMV_BENCH_UPSTREAM
// upstream's decode path for one weight: quantize_q8_1 of the activations, then mul_mat_vec_q
static void launch_upstream(ggml_backend_cuda_context & ctx, int type, const uint8_t * w, const float * x, char * xq8, float * y,
                            int n, int k, int m, cudaStream_t st) {
    const int64_t kpad = GGML_PAD(k, MATRIX_ROW_PADDING);
    ggml_tensor src0 = {}, src1 = {}, dst = {};
    src0.type = ggml_type_of(type);
    src0.ne[0] = k; src0.ne[1] = n;
    src1.type = GGML_TYPE_F32; src1.ne[0] = k; src1.ne[1] = m;
    dst.type  = GGML_TYPE_F32; dst.ne[0] = n;  dst.ne[1] = m;
    quantize_row_q8_1_cuda(x, nullptr, xq8, src0.type, k, k, (int64_t) k*m, (int64_t) k*m, kpad, m, 1, 1, st);
    ggml_cuda_op_mul_mat_vec_q(ctx, &src0, &src1, &dst, (const char *) w, x, xq8, y, 0, n, m, kpad, st);
}
#endif

// Median time of one op, from graph replays of `len` back-to-back ops (op(i) issues op number i).
template <typename F>
static double time_graph(cudaStream_t st, int len, F op) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < len; ++i) op(i);
    CUDA_CHECK(cudaStreamEndCapture(st, &g));
    CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    std::vector<float> ms;
    for (int rep = 0; rep < 9; ++rep) {
        CUDA_CHECK(cudaEventRecord(e0, st));
        CUDA_CHECK(cudaGraphLaunch(ge, st));
        CUDA_CHECK(cudaEventRecord(e1, st));
        CUDA_CHECK(cudaEventSynchronize(e1));
        float t;
        CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
        if (rep >= 2) ms.push_back(t);  // two warm-up replays
    }
    CUDA_CHECK(cudaGetLastError());
    std::sort(ms.begin(), ms.end());
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    CUDA_CHECK(cudaGraphExecDestroy(ge));
    CUDA_CHECK(cudaGraphDestroy(g));
    return 1e3*ms[ms.size()/2]/len;  // us per op
}

// Read ceiling of this card now: 16-byte loads over 4 GiB, xor-reduced so nothing is optimized away.
static __global__ void read_ceiling_kernel(const uint4 * p, int64_t n, uint32_t * out) {
    uint32_t acc = 0;
    for (int64_t i = (int64_t) blockIdx.x*blockDim.x + threadIdx.x; i < n; i += (int64_t) gridDim.x*blockDim.x) {
        const uint4 v = gemv_il_load_stream16((const uint8_t *) (p + i));
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678u) *out = acc;
}

static double measure_read_ceiling(cudaStream_t st) {
    const size_t bytes = (size_t) 4 << 30;
    dev_buf buf(bytes), out(4);
    CUDA_CHECK(cudaMemsetAsync(buf.p, 0x5A, bytes, st));
    const double us = time_graph(st, 4, [&](int) {
        read_ceiling_kernel<<<g_prop.multiProcessorCount*8, 512, 0, st>>>(buf.as<uint4>(), (int64_t) (bytes/16), out.as<uint32_t>());
    });
    return bytes / us * 1e-3;  // GB/s
}

struct shape { int k, n; bool timed; };

struct result_row {
    int type, k, n, m;
    double ours_us = 0, ours_q_us = 0, up_us = 0;
    int nwarps = 0;
};

static int g_failed = 0, g_passed = 0;

static void report(bool ok, const char * fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "ok  " : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    ok ? ++g_passed : ++g_failed;
}

static void run_shape(int type, const shape & sh, uint64_t seed, cudaStream_t st, std::vector<result_row> & rows,
                      ggml_backend_cuda_context * up_ctx) {
    const int k = sh.k, n = sh.n;
    GGML_ASSERT(gemv_il_supported_shape(n, k));
    const size_t wbytes = (size_t) n*gemv_il_row_bytes(type, k);
    const char * tn = type_name(type);

    // fresh random weights (ggml layout) and 8 token rows
    std::vector<uint8_t> w(wbytes);
    ref_fill_weights(type, n, k, w.data(), seed);
    std::vector<float> x((size_t) GEMV_IL_MAX_TOKENS*k);
    ref_fill_activations(k, x.data(), seed ^ 0xABCDEFull);

    // the prefill's in-place tile moves (gemv_il_relayout_tiles) vs the host re-layout, and back, where a
    // tile fits in a CTA's shared memory (else the host's re-layout is uploaded, as set_tensor does)
    dev_buf d_w(wbytes), d_il(wbytes);
    const int64_t ntiles = n / GEMV_IL_TILE_ROWS, tb = gemv_il_tile_bytes(type, k);
    const bool in_place = gemv_il_relayout_smem(type, k) <= g_prop.sharedMemPerBlockOptin;
    std::vector<uint8_t> il_host = w;
    ref_parallel_for(ntiles, [&](int64_t t) { gemv_il_relayout_tile(type, k, w.data() + t*tb, il_host.data() + t*tb, false); });
    CUDA_CHECK(cudaMemcpyAsync(d_w.p, w.data(), wbytes, cudaMemcpyHostToDevice, st));
    {
        std::vector<uint8_t> il_dev(wbytes);
        dev_buf d_back(wbytes);
        if (in_place) {
            CUDA_CHECK(cudaMemcpyAsync(d_il.p, d_w.p, wbytes, cudaMemcpyDeviceToDevice, st));
            gemv_il_relayout_tiles_cuda(type, d_il.as<uint8_t>(), k, ntiles, false, st);
            CUDA_CHECK(cudaMemcpyAsync(il_dev.data(), d_il.p, wbytes, cudaMemcpyDeviceToHost, st));
            CUDA_CHECK(cudaStreamSynchronize(st));
            report(il_dev == il_host, "%s k=%d n=%d: device re-layout in place (tile in shared memory) equals the host re-layout", tn, k, n);
            CUDA_CHECK(cudaMemcpyAsync(d_back.p, d_il.p, wbytes, cudaMemcpyDeviceToDevice, st));
            gemv_il_relayout_tiles_cuda(type, d_back.as<uint8_t>(), k, ntiles, true, st);
            CUDA_CHECK(cudaMemcpyAsync(il_dev.data(), d_back.p, wbytes, cudaMemcpyDeviceToHost, st));
            CUDA_CHECK(cudaStreamSynchronize(st));
            report(il_dev == w, "%s k=%d n=%d: device inverse re-layout in place gives the ggml bytes back", tn, k, n);
        } else {
            CUDA_CHECK(cudaMemcpyAsync(d_il.p, il_host.data(), wbytes, cudaMemcpyHostToDevice, st));
            printf("skip %s k=%d n=%d: a tile (%lld bytes) exceeds a CTA's shared memory: no in-place moves\n", tn, k, n, (long long) tb);
        }

        // the prefill path's out-of-place de-interleave (full tiles; the partial tile is copied raw)
        const int64_t il_bytes = ntiles*tb;
        std::vector<uint8_t> plain(wbytes, 0xAB), want(w.begin(), w.begin() + il_bytes);
        CUDA_CHECK(cudaMemsetAsync(d_back.p, 0xAB, wbytes, st));
        if (ntiles > 0) gemv_il_deinterleave_cuda(type, d_il.as<uint8_t>(), d_back.as<uint8_t>(), k, ntiles, st);
        CUDA_CHECK(cudaMemcpyAsync(plain.data(), d_back.p, wbytes, cudaMemcpyDeviceToHost, st));
        CUDA_CHECK(cudaStreamSynchronize(st));
        report(std::equal(want.begin(), want.end(), plain.begin()), "%s k=%d n=%d: device de-interleave (prefill) gives the ggml bytes", tn, k, n);
        if (ntiles > 0 && il_bytes >= (64 << 20)) {
            const double us = time_graph(st, 4, [&](int) { gemv_il_deinterleave_cuda(type, d_il.as<uint8_t>(), d_back.as<uint8_t>(), k, ntiles, st); });
            printf("     de-interleave %s k=%d n=%d: %.1f us, %.0f GB/s read + written\n", tn, k, n, us, 2e-3*il_bytes/us);
            if (in_place) {
                const double us2 = time_graph(st, 2, [&](int i) { gemv_il_relayout_tiles_cuda(type, d_il.as<uint8_t>(), k, ntiles, i == 0, st); });
                printf("     in place to ggml's layout and back %s k=%d n=%d: %.1f us a move, %.0f GB/s read + written\n", tn, k, n, us2, 2e-3*il_bytes/us2);
            }
        }
    }

    // W4A8's prefill expansion to Q8_0 (full tiles interleaved, the partial tile as ggml's rows) against
    // the reference's levels and d, block for block
    if (type == GEMV_IL_W4A8) {
        const size_t q8_bytes = (size_t) n*(k/32)*sizeof(block_q8_0);
        std::vector<uint8_t> want(q8_bytes), got(q8_bytes);
        for (int64_t r = 0; r < n; ++r) {
            for (int64_t b = 0; b < k/32; ++b) {
                int v[32];
                double a, c;
                ref_decode32(type, w.data() + r*gemv_il_row_bytes(type, k), b, v, a, c);
                block_q8_0 blk;
                blk.d = __float2half((float) a);
                for (int i = 0; i < 32; ++i) blk.qs[i] = (int8_t) v[i];
                memcpy(want.data() + (r*(k/32) + b)*sizeof(block_q8_0), &blk, sizeof(blk));
            }
        }
        dev_buf d_q8(q8_bytes);
        CUDA_CHECK(cudaMemsetAsync(d_q8.p, 0xAB, q8_bytes, st));
        launch_w4a8_to_q8_0(d_il.as<uint8_t>(), d_q8.as<uint8_t>(), k, n, st);
        CUDA_CHECK(cudaMemcpyAsync(got.data(), d_q8.p, q8_bytes, cudaMemcpyDeviceToHost, st));
        CUDA_CHECK(cudaStreamSynchronize(st));
        report(got == want, "%s k=%d n=%d: device expansion to Q8_0 (prefill) gives the reference's blocks", tn, k, n);
    }

    // reference: every output of the 8 token rows, float64
    std::vector<int8_t> q((size_t) GEMV_IL_MAX_TOKENS*k);
    std::vector<float> d((size_t) GEMV_IL_MAX_TOKENS*(k/32)), sum(d.size());
    ref_quantize(k, GEMV_IL_MAX_TOKENS, x.data(), q.data(), d.data(), sum.data());
    const ref_result ref = ref_mul_mat(type, n, k, w.data(), x.data(), q.data(), d.data());

    dev_buf d_x(x.size()*4), d_xq(gemv_il_xq_bytes(k)), d_xs(2*gemv_il_xs_count(k)*4), d_y((size_t) GEMV_IL_MAX_TOKENS*n*4);
    CUDA_CHECK(cudaMemcpyAsync(d_x.p, x.data(), x.size()*4, cudaMemcpyHostToDevice, st));
    const uint32_t poison = 0xFFFFFFFFu;  // a NaN
    std::vector<float> y((size_t) GEMV_IL_MAX_TOKENS*n);
    const int nw_auto = pick_nwarps(type, n, k);

    for (int m = 1; m <= GEMV_IL_MAX_TOKENS; ++m) {
        // the device quantization must give the host's codes bit for bit (rows >= m zero)
        std::vector<int8_t> qm(q.size());
        std::vector<float> dm(d.size()), sm(d.size()), xs_host(2*gemv_il_xs_count(k)), xs_dev(xs_host.size());
        std::vector<uint8_t> xq_host(gemv_il_xq_bytes(k)), xq_dev(xq_host.size());
        ref_quantize(k, m, x.data(), qm.data(), dm.data(), sm.data());
        ref_interleave_activations(k, qm.data(), dm.data(), sm.data(), xq_host.data(), xs_host.data());
        CUDA_CHECK(cudaMemsetAsync(d_xq.p, 0x55, xq_host.size(), st));
        launch_quantize(d_x.as<float>(), k, k, m, d_xq.as<uint8_t>(), d_xs.as<float>(), st);
        CUDA_CHECK(cudaGetLastError());
        CUDA_CHECK(cudaMemcpyAsync(xq_dev.data(), d_xq.p, xq_dev.size(), cudaMemcpyDeviceToHost, st));
        CUDA_CHECK(cudaMemcpyAsync(xs_dev.data(), d_xs.p, xs_dev.size()*4, cudaMemcpyDeviceToHost, st));
        CUDA_CHECK(cudaStreamSynchronize(st));
        const bool qok = xq_dev == xq_host && memcmp(xs_dev.data(), xs_host.data(), xs_host.size()*4) == 0;
        if (!qok || m == GEMV_IL_MAX_TOKENS) {
            report(qok, "%s k=%d n=%d m=%d: device activation codes, scales and sums equal the host's", tn, k, n, m);
        }

        // every variant and K split at m = 1 and 8, the default one at every m
        for (int u : gemv_stages) {
            for (int nw = 1; nw <= GEMV_IL_MAX_WARPS; ++nw) {
                const bool deflt = u == gemv_il_stages(type) && nw == nw_auto;
                if (!deflt && m != 1 && m != GEMV_IL_MAX_TOKENS) continue;
                CUDA_CHECK(cudaMemsetAsync(d_y.p, 0xFF, y.size()*4, st));
                launch_gemv(type, u, d_il.as<uint8_t>(), d_xq.as<uint8_t>(), d_xs.as<float>(), d_y.as<float>(), n, k, m, nw, st);
                CUDA_CHECK(cudaGetLastError());
                CUDA_CHECK(cudaMemcpyAsync(y.data(), d_y.p, y.size()*4, cudaMemcpyDeviceToHost, st));
                CUDA_CHECK(cudaStreamSynchronize(st));
                const ref_check c = ref_compare(ref, n, m, y.data(), poison);
                if (!c.ok || deflt) {
                    report(c.ok, "%s k=%d n=%d m=%d S=%d nwarps=%d: rel err %.2e vs same-quantized float64, %.2e vs float activations, %lld bad",
                           tn, k, n, m, u, nw, c.err_q, c.err_f, (long long) c.bad);
                } else {
                    ++g_passed;
                }
            }
        }
        // a type of tile loops: the default split in grids of 1 and 3 CTAs that loop over every tile; and its
        // epilogue's argmax keys and sums of squares by tile there, from the outputs just checked (the same bits)
        if (gemv_il_persistent(type) && (m == 1 || m == GEMV_IL_MAX_TOKENS)) {
            const int u = gemv_il_stages(type), ntiles_all = (n + GEMV_IL_TILE_ROWS - 1)/GEMV_IL_TILE_ROWS;
            std::vector<float> y_one(y.size());
            for (int ctas : {1, 3}) {
                CUDA_CHECK(cudaMemsetAsync(d_y.p, 0xFF, y.size()*4, st));
                launch_gemv(type, u, d_il.as<uint8_t>(), d_xq.as<uint8_t>(), d_xs.as<float>(), d_y.as<float>(), n, k, m, nw_auto, st, {}, ctas);
                CUDA_CHECK(cudaMemcpyAsync(y_one.data(), d_y.p, y.size()*4, cudaMemcpyDeviceToHost, st));
                CUDA_CHECK(cudaStreamSynchronize(st));
                const ref_check c = ref_compare(ref, n, m, y_one.data(), poison);
                report(c.ok, "%s k=%d n=%d m=%d S=%d nwarps=%d, %d CTA(s) looping over the tiles: rel err %.2e vs same-quantized float64, %lld bad",
                       tn, k, n, m, u, nw_auto, ctas, c.err_q, (long long) c.bad);
            }
            dev_buf d_keys(GEMV_IL_MAX_TOKENS*sizeof(unsigned long long)), d_sums((size_t) GEMV_IL_MAX_TOKENS*ntiles_all*4);
            CUDA_CHECK(cudaMemsetAsync(d_keys.p, 0, GEMV_IL_MAX_TOKENS*sizeof(unsigned long long), st));
            CUDA_CHECK(cudaMemsetAsync(d_sums.p, 0xFF, (size_t) GEMV_IL_MAX_TOKENS*ntiles_all*4, st));
            gemv_il_epilogue am, sq;
            am.argmax = d_keys.as<unsigned long long>();
            sq.sums = d_sums.as<float>();
            launch_gemv(type, u, d_il.as<uint8_t>(), d_xq.as<uint8_t>(), d_xs.as<float>(), d_y.as<float>(), n, k, m, nw_auto, st, am, 3);
            CUDA_CHECK(cudaMemsetAsync(d_y.p, 0xFF, y.size()*4, st));
            launch_gemv(type, u, d_il.as<uint8_t>(), d_xq.as<uint8_t>(), d_xs.as<float>(), d_y.as<float>(), n, k, m, nw_auto, st, sq, 3);
            std::vector<unsigned long long> keys(GEMV_IL_MAX_TOKENS);
            std::vector<float> sums((size_t) GEMV_IL_MAX_TOKENS*ntiles_all);
            CUDA_CHECK(cudaMemcpyAsync(keys.data(), d_keys.p, keys.size()*8, cudaMemcpyDeviceToHost, st));
            CUDA_CHECK(cudaMemcpyAsync(sums.data(), d_sums.p, sums.size()*4, cudaMemcpyDeviceToHost, st));
            CUDA_CHECK(cudaStreamSynchronize(st));
            bool same = true;
            for (int t = 0; t < m; ++t) {
                const float * yt = y_one.data() + (size_t) t*n;
                same = same && (int) (0xFFFFFFFFu - (uint32_t) keys[t]) == (int) (std::max_element(yt, yt + n) - yt);
                for (int tile = 0; tile < ntiles_all; ++tile) {
                    float ss = 0.0f;
                    for (int row = tile*GEMV_IL_TILE_ROWS; row < std::min(n, (tile + 1)*GEMV_IL_TILE_ROWS); ++row) {
                        ss += yt[row]*yt[row];
                    }
                    same = same && memcmp(&ss, &sums[(size_t) t*ntiles_all + tile], 4) == 0;
                }
            }
            report(same, "%s k=%d n=%d m=%d, 3 CTAs: the argmax epilogue's rows and the sums of squares by tile match the outputs", tn, k, n, m);
        }
#ifdef GEMV_BENCH_UPSTREAM
        if (upstream_has(type)) {
            // upstream on the ggml layout: checked loosely (its q8_1 activations differ from ours)
            dev_buf d_q8((size_t) m*GGML_PAD(k, MATRIX_ROW_PADDING)/32*sizeof(block_q8_1));
            CUDA_CHECK(cudaMemsetAsync(d_y.p, 0xFF, y.size()*4, st));
            launch_upstream(*up_ctx, type, d_w.as<uint8_t>(), d_x.as<float>(), d_q8.as<char>(), d_y.as<float>(), n, k, m, st);
            CUDA_CHECK(cudaGetLastError());
            CUDA_CHECK(cudaMemcpyAsync(y.data(), d_y.p, y.size()*4, cudaMemcpyDeviceToHost, st));
            CUDA_CHECK(cudaStreamSynchronize(st));
            const ref_check c = ref_compare(ref, n, m, y.data(), poison);
            const bool ok = std::isfinite(c.err_f) && c.err_f < 5e-2;
            if (!ok || m == GEMV_IL_MAX_TOKENS) {
                report(ok, "%s k=%d n=%d m=%d: upstream mmvq rel err %.2e vs float activations (harness wiring check)", tn, k, n, m, c.err_f);
            }
        }
#endif
    }
    if (!sh.timed) {
        return;
    }

    // timings: weights rotated over >= 400 MB so that every op reads them from memory
    const int nrot = (int) std::max<size_t>(1, ((size_t) 400 << 20) / wbytes + 1);
    std::vector<std::unique_ptr<dev_buf>> rot_il, rot_w;
    for (int r = 0; r < nrot; ++r) {
        rot_il.emplace_back(new dev_buf(wbytes));
        CUDA_CHECK(cudaMemcpyAsync(rot_il.back()->p, d_il.p, wbytes, cudaMemcpyDeviceToDevice, st));
#ifdef GEMV_BENCH_UPSTREAM
        rot_w.emplace_back(new dev_buf(wbytes));
        CUDA_CHECK(cudaMemcpyAsync(rot_w.back()->p, d_w.p, wbytes, cudaMemcpyDeviceToDevice, st));
#endif
    }
    const int len = std::max(nrot, 16) / nrot * nrot;
    dev_buf d_q8((size_t) GEMV_IL_MAX_TOKENS*GGML_PAD(k, 512)/32*36);
    for (int m = 1; m <= GEMV_IL_MAX_TOKENS; ++m) {
        result_row row{type, k, n, m};
        row.nwarps = nw_auto;
        launch_quantize(d_x.as<float>(), k, k, m, d_xq.as<uint8_t>(), d_xs.as<float>(), st);
        row.ours_us = time_graph(st, len, [&](int i) {
            launch_gemv(type, gemv_il_stages(type), rot_il[i % nrot]->as<uint8_t>(), d_xq.as<uint8_t>(), d_xs.as<float>(), d_y.as<float>(), n, k, m, nw_auto, st);
        });
        row.ours_q_us = time_graph(st, len, [&](int i) {
            launch_quantize(d_x.as<float>(), k, k, m, d_xq.as<uint8_t>(), d_xs.as<float>(), st);
            launch_gemv(type, gemv_il_stages(type), rot_il[i % nrot]->as<uint8_t>(), d_xq.as<uint8_t>(), d_xs.as<float>(), d_y.as<float>(), n, k, m, nw_auto, st);
        });
#ifdef GEMV_BENCH_UPSTREAM
        if (upstream_has(type)) row.up_us = time_graph(st, len, [&](int i) {
            launch_upstream(*up_ctx, type, rot_w[i % nrot]->as<uint8_t>(), d_x.as<float>(), d_q8.as<char>(), d_y.as<float>(), n, k, m, st);
        });
#endif
        if (m == 1 || m == GEMV_IL_MAX_TOKENS) {
            for (int u : gemv_stages) {
                for (int nw = 1; nw <= GEMV_IL_MAX_WARPS; nw *= 2) {
                    const double us = time_graph(st, len, [&](int i) {
                        launch_gemv(type, u, rot_il[i % nrot]->as<uint8_t>(), d_xq.as<uint8_t>(), d_xs.as<float>(), d_y.as<float>(), n, k, m, nw, st);
                    });
                    printf("     sweep %s k=%d n=%d m=%d S=%d nwarps=%2d: %8.2f us  %6.0f GB/s%s\n", tn, k, n, m, u, nw, us, wbytes/us*1e-3,
                           u == gemv_il_stages(type) && nw == nw_auto ? "  (default)" : "");
                }
            }
        }
        rows.push_back(row);
    }
    (void) up_ctx;
}

// A decode token's GEMVs: layers of DeltaNet (in_proj, ssm_out) or, every 4th, gated attention (qkv, wo),
// each then the FFN (gate+up, down); then the 248320-row head in Q6_K. `k_mid`: the input width of
// ssm_out and wo (the DeltaNet value width and the attention heads' width are equal in both shapes).
struct token_shape { const char * name; int hidden, layers, dn_in, attn_qkv, k_mid, ffn; };
static const token_shape token_shapes[] = {
    {"9b",  4096, 32, 12352, 10240, 4096, 12288},
    {"27b", 5120, 64, 16480, 14336, 6144, 17408},
};

#ifdef GEMV_TIMELINE
// One GEMV of the timeline: its tiles' slots and what it reads.
struct tl_gemv { size_t at, tile_bytes; int ntiles, k, n, nwarps; double bytes; };

// Replays the token's graph once more with every GEMV CTA stamping its times, then sums them by GEMV shape:
// wait = from the previous GEMV's last CTA's exit to this one's first CTA past its PDL wait (the quantization
// kernel between them and both completions), early = how long before that exit its first CTA was resident,
// body = from that release to its last CTA's exit against the bytes at the read ceiling, tail = its last exit
// after the median one; waves = tiles over the most CTAs alive at once, CTA life = the median CTA's time past
// its wait. The stamps' own cost shows as the replay's time against the timed one.
template <typename F>
static void token_timeline(const std::vector<tl_gemv> & gs, const uint8_t * arena, size_t arena_bytes, double ceil_gbs,
                           double us_timed, cudaStream_t st, F issue) {
    const size_t nslots = (arena_bytes >> GEMV_TL_SLOT_SHIFT) + 1;
    dev_buf slots(nslots*sizeof(gemv_tl_slot)), res(sizeof(unsigned long long));
    gemv_tl_resolution<<<1, 1, 0, st>>>(res.as<unsigned long long>());
    unsigned long long step = 0;
    CUDA_CHECK(cudaMemcpyAsync(&step, res.p, sizeof step, cudaMemcpyDeviceToHost, st));
    CUDA_CHECK(cudaMemsetAsync(slots.p, 0, nslots*sizeof(gemv_tl_slot), st));
    CUDA_CHECK(cudaStreamSynchronize(st));
    gemv_tl_slot * on = slots.as<gemv_tl_slot>(), * off = nullptr;
    CUDA_CHECK(cudaMemcpyToSymbol(gemv_tl_slots, &on, sizeof on));
    CUDA_CHECK(cudaMemcpyToSymbol(gemv_tl_base, &arena, sizeof arena));
    const double us_stamped = time_graph(st, 1, issue); // the slots hold its last replay
    CUDA_CHECK(cudaMemcpyToSymbol(gemv_tl_slots, &off, sizeof off));
    std::vector<gemv_tl_slot> h(nslots);
    CUDA_CHECK(cudaMemcpy(h.data(), slots.p, nslots*sizeof(gemv_tl_slot), cudaMemcpyDeviceToHost));

    struct cls { int launches = 0, warps = 0; double ideal = 0, body = 0, wait = 0, early = 0, tail = 0, life = 0, waves = 0; };
    std::vector<std::pair<std::pair<int, int>, cls>> by_shape; // in order of first appearance
    double first_start = 0, prev_exit = 0, sum_ideal = 0, sum_body = 0, sum_wait = 0;
    int missing = 0;
    // microseconds after the first GEMV's first tile started: the timer's ~1.8e18 ns would lose a double's precision
    const unsigned long long base = h[gs[0].at >> GEMV_TL_SLOT_SHIFT].t[0];
    const auto us_of = [&](unsigned long long t) { return 1e-3*(double) (long long) (t - base); };
    for (size_t i = 0; i < gs.size(); ++i) {
        const tl_gemv & g = gs[i];
        std::vector<double> start, release, exit_, life;
        std::vector<std::pair<double, int>> alive; // +1 at a CTA's start, -1 at its exit
        for (int t = 0; t < g.ntiles; ++t) {
            const gemv_tl_slot & sl = h[(g.at + t*g.tile_bytes) >> GEMV_TL_SLOT_SHIFT];
            if (sl.t[0] == 0 || sl.t[1] == 0 || sl.t[3] == 0) { ++missing; continue; }
            start.push_back(us_of(sl.t[0])); release.push_back(us_of(sl.t[1])); exit_.push_back(us_of(sl.t[3]));
            life.push_back(exit_.back() - std::max(start.back(), release.back())); // past its wait
            alive.push_back({start.back(), 1}); alive.push_back({exit_.back(), -1});
        }
        if (start.empty()) continue;
        std::sort(life.begin(), life.end()); std::sort(alive.begin(), alive.end());
        int now = 0, peak = 0;
        for (const auto & e : alive) peak = std::max(peak, now += e.second);
        std::sort(start.begin(), start.end()); std::sort(release.begin(), release.end()); std::sort(exit_.begin(), exit_.end());
        const double last_exit = exit_.back(), ideal = g.bytes*1e-3/ceil_gbs, body = last_exit - release.front();
        auto it = std::find_if(by_shape.begin(), by_shape.end(), [&](const auto & c) { return c.first == std::make_pair(g.k, g.n); });
        if (it == by_shape.end()) { by_shape.push_back({{g.k, g.n}, {}}); it = by_shape.end() - 1; }
        cls & c = it->second;
        ++c.launches; c.ideal += ideal; c.body += body; c.tail += last_exit - exit_[exit_.size()/2];
        c.life += life[life.size()/2]; c.waves += (double) g.ntiles/peak; c.warps = g.nwarps;
        sum_ideal += ideal; sum_body += body;
        if (i == 0) {
            first_start = start.front();
        } else {
            c.wait += release.front() - prev_exit; c.early += prev_exit - start.front();
            sum_wait += release.front() - prev_exit;
        }
        prev_exit = last_exit;
    }
    printf("timeline (global timer step %llu ns; replay with stamps %.1f us, without %.1f; %d tiles unstamped):\n"
           "| k x n | launches | warps | waves | ideal us | body us | of read | wait us | early us | tail us | CTA life us |\n"
           "|---|---|---|---|---|---|---|---|---|---|---|\n",
           step, us_stamped, us_timed, missing);
    for (const auto & [shape, c] : by_shape) {
        const double n = c.launches;
        printf("| %d x %d | %d | %d | %.2f | %.2f | %.2f | %.0f%% | %.2f | %.2f | %.2f | %.2f |\n", shape.first, shape.second, c.launches,
               c.warps, c.waves/n, c.ideal/n, c.body/n, 100.0*c.ideal/c.body, c.wait/n, c.early/n, c.tail/n, c.life/n);
    }
    printf("token: first start to last exit %.1f us = bodies %.1f (ideal %.1f) + waits %.1f\n",
           prev_exit - first_start, sum_body, sum_ideal, sum_wait);
}
#endif // GEMV_TIMELINE

// The GEMVs of one decode token of a Qwen3.5 shape (pyqwen synth's 9B or 27B), each after its activation
// quantization, all in one CUDA graph, every weight in its own part of one arena (4.7 GB for the 9B,
// far beyond the L2). The bytes are not a real layout: the kernels' time does not depend on them. What a
// token's GEMVs cost against the read ceiling, launch gaps and tails included (the census of
// bench/census.py has the same kernels inside the model); GGML_CUDA_PDL=0 in the environment turns
// programmatic dependent launch off (pyqwen keeps it on for these kernels), GEMV_TOKEN_QUANT=0 the
// quantization launches. GEMV_TOKEN_PROLOGUES=1: each quantization computes what pyqwen fuses into it
// (the input norms from the sums of squares the residual GEMV before wrote, the gated norm before
// ssm_out, the output gate before wo, SwiGLU before ffn_down), and ssm_out, wo and ffn_down add the
// residual and write those sums, as in the model; else every quantization is the plain one.
static void run_token(int type, const token_shape & sh, double ceil_gbs, cudaStream_t st) {
    // prologue: the quantization's (gemv_il_prologue); residual: the GEMV adds the residual and writes the sums
    struct gemv { int type, k, n; size_t at; gemv_il_prologue prologue; bool residual; };
    std::vector<gemv> seq;
    size_t bytes = 0;
    const auto add = [&](int t, int k, int n, gemv_il_prologue prologue, bool residual) {
        seq.push_back({t, k, n, bytes, prologue, residual});
        bytes += (size_t) n*gemv_il_row_bytes(t, k);
    };
    for (int il = 0; il < sh.layers; ++il) {
        const bool attn = il % 4 == 3;
        add(type, sh.hidden, attn ? sh.attn_qkv : sh.dn_in, GEMV_IL_RMS_NORM, false);
        add(type, sh.k_mid, sh.hidden, attn ? GEMV_IL_SIGMOID_GATE : GEMV_IL_GATED_NORM, true);
        add(type, sh.hidden, 2*sh.ffn, GEMV_IL_RMS_NORM, false);
        add(type, sh.ffn, sh.hidden, GEMV_IL_SWIGLU, true);
    }
    add(GEMV_IL_Q6_K, sh.hidden, 248320, GEMV_IL_RMS_NORM, false);
    const int kmax = sh.ffn, ntiles = sh.hidden/GEMV_IL_TILE_ROWS;
    const int64_t stride_x = 2*kmax; // SwiGLU's rows hold gate | up
    dev_buf w(bytes), x((size_t) stride_x*GEMV_IL_MAX_TOKENS*sizeof(float)), y((size_t) 248320*GEMV_IL_MAX_TOKENS*sizeof(float));
    dev_buf xq(gemv_il_xq_bytes(kmax)), xs(2*gemv_il_xs_count(kmax)*sizeof(float));
    dev_buf z((size_t) sh.k_mid*GEMV_IL_MAX_TOKENS*sizeof(float)), norm_w((size_t) kmax*sizeof(float));
    dev_buf sums((size_t) ntiles*GEMV_IL_MAX_TOKENS*sizeof(float));
    CUDA_CHECK(cudaMemsetAsync(w.p, 0x11, bytes, st));
    CUDA_CHECK(cudaMemsetAsync(x.p, 0, (size_t) stride_x*GEMV_IL_MAX_TOKENS*sizeof(float), st));
    CUDA_CHECK(cudaMemsetAsync(z.p, 0, (size_t) sh.k_mid*GEMV_IL_MAX_TOKENS*sizeof(float), st));
    CUDA_CHECK(cudaMemsetAsync(norm_w.p, 0, (size_t) kmax*sizeof(float), st));
    CUDA_CHECK(cudaMemsetAsync(sums.p, 0, (size_t) ntiles*GEMV_IL_MAX_TOKENS*sizeof(float), st));
    // GEMV_TOKEN_NWARPS="KxN=W[/S],...": W warps a CTA (and S register stages) for the GEMVs of that shape instead
    // of pyqwen's choice (a sweep)
    const char * nwarps_env = getenv("GEMV_TOKEN_NWARPS");
    std::vector<int> nwarps, stages;
    for (const gemv & g : seq) {
        int nw = pick_nwarps(g.type, g.n, g.k), u = gemv_il_stages(g.type);
        for (const char * p = nwarps_env; p != nullptr; p = strchr(p, ',') ? strchr(p, ',') + 1 : nullptr) {
            int k, n, w, su = 0;
            const int got = sscanf(p, "%dx%d=%d/%d", &k, &n, &w, &su);
            if (got < 3 || w < 1 || w > GEMV_IL_MAX_WARPS || (got == 4 && (su < 1 || su > 4))) {
                fprintf(stderr, "GEMV_TOKEN_NWARPS: '%s' is not KxN=W or KxN=W/S with W from 1 to %d and S from 1 to 4\n",
                        p, GEMV_IL_MAX_WARPS);
                exit(2);
            }
            if (k == g.k && n == g.n) {
                nw = std::min(w, g.k/GEMV_IL_CHUNK_K);
                if (got == 4) u = su;
            }
        }
        nwarps.push_back(nw);
        stages.push_back(u);
    }
    if (type == GEMV_IL_W4A8) device_w4a8_luts();  // made before the capture, which cannot allocate
    const char * pdl = getenv("GGML_CUDA_PDL");
    // GEMV_TOKEN_QUANT=0: the GEMVs alone, on codes quantized once before the graph: what the 129
    // quantization launches on the critical path cost, the most an in-GEMV quantization could save
    const char * quant_env = getenv("GEMV_TOKEN_QUANT"), * prologues_env = getenv("GEMV_TOKEN_PROLOGUES");
    const bool quant = !quant_env || atoi(quant_env) != 0, prologues = prologues_env && atoi(prologues_env) != 0;
    // GEMV_TOKEN_SKIP="rms_norm,swiglu" (with the prologues): drops only the quantizations of those prologues, the
    // most that moving them into the GEMVs that write their inputs could save
    const char * skip_env = getenv("GEMV_TOKEN_SKIP");
    const auto skipped = [&](gemv_il_prologue p) {
        static const char * const names[] = {"plain", "rms_norm", "swiglu", "gated_norm", "sigmoid_gate"};
        return skip_env != nullptr && strstr(skip_env, names[p]) != nullptr;
    };
    launch_quantize(x.as<float>(), stride_x, kmax, GEMV_IL_MAX_TOKENS, xq.as<uint8_t>(), xs.as<float>(), st);
    printf("\n| %s %s token, PDL %s%s%s%s%s | M | us per token | GEMV launches | GB | TB/s | %% of read |\n|---|---|---|---|---|---|---|\n",
           sh.name, type_name(type), pdl && atoi(pdl) == 0 ? "off" : "on",
           !quant ? ", no quantization" : skip_env ? ", no quantization for " : prologues ? ", the model's prologues and residuals" : "",
           skip_env ? skip_env : "",
           nwarps_env ? ", warps " : "", nwarps_env ? nwarps_env : "");
    for (int m : {1, 8}) {
        const auto issue = [&](int) {
            for (size_t i = 0; i < seq.size(); ++i) {
                const gemv & g = seq[i];
                gemv_il_prologue_args args;
                gemv_il_epilogue ep;
                const gemv_il_prologue prologue = prologues ? g.prologue : GEMV_IL_PLAIN;
                if (prologue == GEMV_IL_RMS_NORM) {
                    args.w = norm_w.as<float>(); args.eps = 1e-6f; args.sums = sums.as<float>(); args.ntiles = ntiles;
                } else if (prologue == GEMV_IL_GATED_NORM || prologue == GEMV_IL_SIGMOID_GATE) {
                    args.z = z.as<float>(); args.stride_z = sh.k_mid;
                    args.head = prologue == GEMV_IL_GATED_NORM ? 128 : 256; // a DeltaNet head, an attention head
                    args.w = norm_w.as<float>(); args.eps = 1e-6f; args.stride_zh = args.head;
                }
                if (prologues && g.residual) {
                    ep.res = y.as<float>(); ep.stride_res = g.n; ep.sums = sums.as<float>();
                }
                if (quant && !skipped(prologue)) {
                    launch_quantize(x.as<float>(), stride_x, g.k, m, xq.as<uint8_t>(), xs.as<float>(), st, prologue, args);
                }
                launch_gemv(g.type, stages[i], w.as<uint8_t>() + g.at, xq.as<uint8_t>(), xs.as<float>(), y.as<float>(),
                            g.n, g.k, m, nwarps[i], st, ep);
            }
        };
        const double us = time_graph(st, 1, issue);
        printf("| | %d | %.1f | %zu | %.2f | %.2f | %.0f |\n", m, us, seq.size(), bytes*1e-9, bytes*1e-6/us, 100.0*bytes*1e-3/us/ceil_gbs);
#ifdef GEMV_TIMELINE
        const char * timeline_env = getenv("GEMV_TOKEN_TIMELINE");
        if (timeline_env && atoi(timeline_env) != 0) {
            std::vector<tl_gemv> gs;
            for (const gemv & g : seq) {
                const size_t i = gs.size();
                gs.push_back({g.at, (size_t) gemv_il_tile_bytes(g.type, g.k), (g.n + GEMV_IL_TILE_ROWS - 1)/GEMV_IL_TILE_ROWS, g.k, g.n,
                              nwarps[i], (double) g.n*gemv_il_row_bytes(g.type, g.k)});
            }
            token_timeline(gs, w.as<uint8_t>(), bytes, ceil_gbs, us, st, issue);
        }
#endif // GEMV_TIMELINE
    }
    if (type == GEMV_IL_W4A8) { // a prefill's expansion of the layer weights to Q8_0, each into one slab
        size_t slab = 0;
        for (size_t i = 0; i + 1 < seq.size(); ++i) slab = std::max(slab, (size_t) seq[i].n*(seq[i].k/32)*sizeof(block_q8_0));
        dev_buf q8(slab);
        const double us = time_graph(st, 1, [&](int) {
            for (size_t i = 0; i + 1 < seq.size(); ++i) launch_w4a8_to_q8_0(w.as<uint8_t>() + seq[i].at, q8.as<uint8_t>(), seq[i].k, seq[i].n, st);
        });
        const double gb = seq.back().at*1e-9*(1.0 + 34.0/19.0);  // W4A8 read (19 bytes / 32 weights), Q8_0 written (34)
        printf("W4A8 -> Q8_0 expansion of the %zu layer weights: %.1f us, %.0f GB/s read + written\n", seq.size() - 1, us, gb*1e6/us);
    } else if (gemv_il_relayout_smem(type, sh.ffn) > g_prop.sharedMemPerBlockOptin) { // the widest k
        printf("%s prefill moves: a tile of k = %d exceeds a CTA's shared memory, no in-place moves\n", type_name(type), sh.ffn);
    } else { // a prefill's moves of the layer weights: in place to ggml's layout and back, or copies de-interleaved
        size_t copy = 0;
        for (size_t i = 0; i + 1 < seq.size(); ++i) copy = std::max(copy, (size_t) seq[i].n*gemv_il_row_bytes(type, seq[i].k));
        dev_buf plain(copy);
        const auto in_place = [&](int) {
            for (size_t i = 0; i + 1 < seq.size(); ++i) {
                for (const bool to_plain : {true, false}) {
                    gemv_il_relayout_tiles_cuda(type, w.as<uint8_t>() + seq[i].at, seq[i].k, seq[i].n / GEMV_IL_TILE_ROWS, to_plain, st);
                }
            }
        };
        in_place(0); // raises the kernels' shared memory limit outside the capture
        const double us = time_graph(st, 1, in_place), us_copy = time_graph(st, 1, [&](int) {
            for (size_t i = 0; i + 1 < seq.size(); ++i) {
                gemv_il_deinterleave_cuda(type, w.as<uint8_t>() + seq[i].at, plain.as<uint8_t>(), seq[i].k, seq[i].n / GEMV_IL_TILE_ROWS, st);
            }
        });
        const double gb = seq.back().at*1e-9;
        printf("%s prefill moves of the %zu layer weights: in place and back %.1f us (%.0f GB/s read + written), "
               "de-interleaved copies %.1f us (%.0f GB/s)\n", type_name(type), seq.size() - 1, us, 4*gb*1e6/us, us_copy, 2*gb*1e6/us_copy);
    }
}

int main(int argc, char ** argv) {
    const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
    CUDA_CHECK(cudaGetDeviceProperties(&g_prop, 0));
    printf("device: %s, %d SMs, L2 %d MB, cc %d.%d\n", g_prop.name, g_prop.multiProcessorCount, g_prop.l2CacheSize >> 20, g_prop.major, g_prop.minor);
    cudaStream_t st;
    CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    if (argc > 2 && std::string(argv[1]) == "--token") {
        const std::string t = argv[2], shape_name = argc > 3 ? argv[3] : "9b";
        const int type = t == "q4_0" ? GEMV_IL_Q4_0 : t == "q4_k" ? GEMV_IL_Q4_K : t == "q8_0" ? GEMV_IL_Q8_0 : t == "w4a8" ? GEMV_IL_W4A8 : -1;
        const token_shape * sh = nullptr;
        for (const token_shape & s : token_shapes) if (shape_name == s.name) sh = &s;
        if (type < 0 || sh == nullptr) { fprintf(stderr, "--token takes q4_0, q4_k, q8_0 or w4a8, then 9b (default) or 27b\n"); return 2; }
        const double ceil_gbs = measure_read_ceiling(st);
        printf("read ceiling (4 GiB, 16-byte loads): %.0f GB/s\n", ceil_gbs);
        run_token(type, *sh, ceil_gbs, st);
        return 0;
    }
    const char * only = argc > 1 + quick ? argv[1 + quick] : nullptr;
    if (only && std::none_of(std::begin(gemv_types), std::end(gemv_types), [&](int t) { return std::string(only) == type_name(t); })) {
        fprintf(stderr, "TYPE is one of q4_0, q4_k, q6_k, q8_0, w4a8\n");
        return 2;
    }
    ggml_backend_cuda_context * up_ctx = nullptr;
#ifdef GEMV_BENCH_UPSTREAM
    up_ctx = new ggml_backend_cuda_context(0);  // only .device is read; never destroyed (its destructor lives in ggml-cuda.cu)
#endif

    const std::vector<shape> shapes = {
        {256, 37, false}, {512, 5, false}, {768, 100, false}, {1280, 16, false}, {4096, 1000, false},  // odd: N % 16 != 0, N < 16
        {4096, 248320, true}, {4096, 12288, true}, {12288, 4096, true},                            // output head, ffn up/gate, ffn down
    };
    std::vector<result_row> rows;
    uint64_t seed = 42;
    for (int type : gemv_types) {
        if (only && std::string(only) != type_name(type)) continue;
        for (const shape & sh : shapes) {
            if (quick && sh.timed) continue;
            run_shape(type, sh, ++seed, st, rows, up_ctx);
        }
    }
    const double ceil_gbs = measure_read_ceiling(st);
    printf("read ceiling (4 GiB, 16-byte loads): %.0f GB/s\n", ceil_gbs);

    printf("\n| type | K x N | M | ours us | GB/s | %% of read | +quantize us | upstream us | upstream GB/s | upstream / ours |\n|---|---|---|---|---|---|---|---|---|---|\n");
    for (const auto & r : rows) {
        const double gb = (double) r.n*gemv_il_row_bytes(r.type, r.k)*1e-3;
        printf("| %s | %dx%d | %d | %.1f | %.0f | %.0f | %.1f | %.1f | %.0f | %.2f |\n", type_name(r.type), r.k, r.n, r.m, r.ours_us, gb/r.ours_us,
               100.0*gb/r.ours_us/ceil_gbs, r.ours_q_us, r.up_us, r.up_us > 0 ? gb/r.up_us : 0.0, r.up_us > 0 ? r.up_us/r.ours_q_us : 0.0);
    }
    printf("\nSummary (ours = quantize + GEMV, as upstream is timed; t8/t1 = time(M=8)/time(M=1)):\n");
    printf("| type | K x N | ours M=1 us | GB/s (GEMV only) | ours M=8 us | t8/t1 | upstream M=1 us | upstream t8/t1 |\n|---|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i + 7 < rows.size(); i += 8) {
        const result_row & a = rows[i], & b = rows[i + 7];
        const double gb = (double) a.n*gemv_il_row_bytes(a.type, a.k)*1e-3;
        printf("| %s | %dx%d | %.1f | %.0f | %.1f | %.2f | %.1f | %.2f |\n", type_name(a.type), a.k, a.n, a.ours_q_us, gb/a.ours_us,
               b.ours_q_us, b.ours_q_us/a.ours_q_us, a.up_us, a.up_us > 0 ? b.up_us/a.up_us : 0.0);
    }
    printf("\n%d passed, %d failed\n", g_passed, g_failed);
    return g_failed != 0;
}
