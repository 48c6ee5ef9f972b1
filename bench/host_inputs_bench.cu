// What a decode pass's host-side inputs cost, apart from the model: run_pass's four small uploads
// (kv_seen 2 B, the token's embedding row 16 KB, its position 4 B, its cache index 8 B), a graph
// launch, the 4-byte token read back and the wait, around a kernel that spins for a fixed time in
// place of the model. Per variant: the host's enqueue time (uploads + launch) and the pass's wall
// time above the spin, medians of 2000 passes. Variants: the staging buffers in pageable memory (as
// pq-context.c has them), in pinned memory, and pinned with the four uploads in one copy.
// Then the same passes driven by the device: the token stays there, a small kernel gathers its embedding
// row from the table in host memory through a mapped pointer (zero-copy; the table stays on the host, as
// pq-model.c keeps it) and advances the position, and the host enqueues K passes before it reads their
// tokens back: the pass's wall time above the spin, for K = 1, 4 and 16. Last, the device loop as a
// pipeline one pass deep: the host queues pass t+1 before it waits for pass t's token (a stop token
// would waste one pass, not a batch), with 0 or 30 us of host work a pass (pyqwen's host us/tok is
// 29-41), against the same host work in a round trip; and pipelined with pq-context.c's three small
// uploads a pass (kv_seen, position, cache index) from pageable or from pinned staging buffers, since a
// copy from pageable memory may wait on the stream, which would undo the pipeline.
//   nvcc -std=c++17 -O3 -arch=sm_90 bench/host_inputs_bench.cu -o /tmp/host_inputs_bench
#include <cuda_runtime.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s: %s (%s:%d)\n", #x, cudaGetErrorString(e_), __FILE__, __LINE__); exit(1); } } while (0)

static const size_t SIZES[4] = {2, 16384, 4, 8};  // kv_seen, embedding row, position, cache index
static const size_t TOTAL = 2 + 16384 + 4 + 8;

static __device__ __forceinline__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// stands in for the model: reads the inputs (so the uploads must land first), spins, writes the token
__global__ void pass_kernel(const unsigned char * in, int * token, unsigned long long spin_ns) {
    const unsigned long long t0 = now_ns();
    int acc = 0;
    for (size_t i = 0; i < TOTAL; i += 4096) acc += in[i];
    while (now_ns() - t0 < spin_ns) {}
    *token = acc;
}

// the device loop's table: 9B's vocabulary, a Q4_0 row of 4096 a token
static const int N_VOCAB = 248320, ROW_BYTES = 2304, MAX_K = 16;

// gathers the token's row from the host-mapped table (its bytes as floats, standing in for the dequantization)
// and advances the position
__global__ void advance_kernel(const unsigned char * table, const int * token, float * embd, int * pos) {
    const uint4 * row = (const uint4 *) (table + (size_t) *token * ROW_BYTES);
    for (int i = threadIdx.x; i < ROW_BYTES / 16; i += blockDim.x) {
        const uint4 v = row[i];
        const unsigned char * b = (const unsigned char *) &v;
        for (int j = 0; j < 16; ++j) embd[i * 16 + j] = b[j];
    }
    if (threadIdx.x == 0) ++*pos;
}

// the model's stand-in in the device loop: the next token from the row and the position, kept in out[] too
__global__ void loop_pass_kernel(const float * embd, const int * pos, int * token, int * out, int k, unsigned long long spin_ns) {
    const unsigned long long t0 = now_ns();
    const int s = (int) (embd[0] + embd[777] + embd[ROW_BYTES - 1]);
    while (now_ns() - t0 < spin_ns) {}
    const int t = (int) (((long long) s * 131 + (long long) *pos * 7919) % N_VOCAB);
    *token = t;
    out[(*pos - 1) % k] = t;
}

static int next_token(const unsigned char * table, int token, int pos) {
    const unsigned char * row = table + (size_t) token * ROW_BYTES;
    return (int) (((long long) (row[0] + row[777] + row[ROW_BYTES - 1]) * 131 + (long long) pos * 7919) % N_VOCAB);
}

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

int main() {
    setvbuf(stdout, nullptr, _IOLBF, 0);  // rows written before a time limit kills a run stay in its log
    const unsigned long long spin_ns = 1000000;  // 1 ms, about half a 9B token
    const int passes = 2000;
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    unsigned char * d_in;
    int * d_token;
    CHECK(cudaMalloc(&d_in, TOTAL));
    CHECK(cudaMalloc(&d_token, sizeof(int)));

    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
    pass_kernel<<<1, 1, 0, stream>>>(d_in, d_token, spin_ns);
    CHECK(cudaStreamEndCapture(stream, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));

    unsigned char * pageable = (unsigned char *) malloc(TOTAL);
    int * pageable_token = (int *) malloc(sizeof(int));
    unsigned char * pinned;
    int * pinned_token;
    CHECK(cudaMallocHost(&pinned, TOTAL));
    CHECK(cudaMallocHost(&pinned_token, sizeof(int)));

    struct variant { const char * name; unsigned char * src; int * token; bool one_copy; };
    const variant variants[] = {
        {"pageable, 4 copies", pageable, pageable_token, false},
        {"pinned, 4 copies", pinned, pinned_token, false},
        {"pinned, 1 copy", pinned, pinned_token, true},
    };
    printf("| staging | enqueue us (median) | wall - spin us (median) |\n|---|---:|---:|\n");
    for (int round = 0; round < 2; ++round) {
        for (const variant & v : variants) {
            std::vector<double> enqueue, over;
            for (int p = 0; p < passes + 50; ++p) {
                memset(v.src, p & 0x7f, TOTAL);  // the host writes its inputs, as run_pass does
                const auto t0 = std::chrono::steady_clock::now();
                if (v.one_copy) {
                    CHECK(cudaMemcpyAsync(d_in, v.src, TOTAL, cudaMemcpyHostToDevice, stream));
                } else {
                    size_t off = 0;
                    for (size_t s : SIZES) {
                        CHECK(cudaMemcpyAsync(d_in + off, v.src + off, s, cudaMemcpyHostToDevice, stream));
                        off += s;
                    }
                }
                CHECK(cudaGraphLaunch(exec, stream));
                const auto t1 = std::chrono::steady_clock::now();
                CHECK(cudaMemcpyAsync(v.token, d_token, sizeof(int), cudaMemcpyDeviceToHost, stream));
                CHECK(cudaStreamSynchronize(stream));
                const auto t2 = std::chrono::steady_clock::now();
                if (*v.token != (int) (((TOTAL + 4095) / 4096) * (p & 0x7f))) {
                    fprintf(stderr, "FAIL: %s pass %d read back %d\n", v.name, p, *v.token);
                    return 1;
                }
                if (p < 50) continue;  // warm-up
                enqueue.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
                over.push_back(std::chrono::duration<double, std::micro>(t2 - t0).count() - spin_ns / 1000.0);
            }
            printf("| %s (round %d) | %.2f | %.2f |\n", v.name, round + 1, median(enqueue), median(over));
        }
    }
    printf("ok: every pass read back its inputs\n");

    // the device loop
    const size_t table_bytes = (size_t) N_VOCAB * ROW_BYTES;  // a multiple of the page size
    unsigned char * table = (unsigned char *) aligned_alloc(4096, table_bytes);
    uint32_t x = 1;
    for (size_t i = 0; i < table_bytes; ++i) table[i] = (unsigned char) ((x = x * 1664525u + 1013904223u) >> 24);
    if (cudaHostRegister(table, table_bytes, cudaHostRegisterMapped | cudaHostRegisterReadOnly) != cudaSuccess) {
        (void) cudaGetLastError();  // read-only registration is not everywhere
        CHECK(cudaHostRegister(table, table_bytes, cudaHostRegisterMapped));
    }
    unsigned char * d_table;
    CHECK(cudaHostGetDevicePointer((void **) &d_table, table, 0));
    float * d_embd;
    int * d_pos, * d_out;
    CHECK(cudaMalloc(&d_embd, ROW_BYTES * sizeof(float)));
    CHECK(cudaMalloc(&d_pos, sizeof(int)));
    CHECK(cudaMalloc(&d_out, MAX_K * sizeof(int)));
    printf("\n| device loop, K passes a read-back | wall - spin us a pass (median) |\n|---|---:|\n");
    for (int round = 0; round < 2; ++round) {
        for (int k : {1, 4, 16}) {
            cudaGraph_t lg;
            cudaGraphExec_t lexec;
            CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
            advance_kernel<<<1, 160, 0, stream>>>(d_table, d_token, d_embd, d_pos);
            loop_pass_kernel<<<1, 1, 0, stream>>>(d_embd, d_pos, d_token, d_out, k, spin_ns);
            CHECK(cudaStreamEndCapture(stream, &lg));
            CHECK(cudaGraphInstantiate(&lexec, lg, 0));
            int token = 12345, pos = 0, out[MAX_K];
            CHECK(cudaMemcpy(d_token, &token, sizeof(int), cudaMemcpyHostToDevice));
            CHECK(cudaMemcpy(d_pos, &pos, sizeof(int), cudaMemcpyHostToDevice));
            std::vector<double> over;
            for (int b = 0; b < (passes + 50) / k; ++b) {
                const auto t0 = std::chrono::steady_clock::now();
                for (int i = 0; i < k; ++i) CHECK(cudaGraphLaunch(lexec, stream));
                CHECK(cudaMemcpyAsync(out, d_out, k * sizeof(int), cudaMemcpyDeviceToHost, stream));
                CHECK(cudaStreamSynchronize(stream));
                const auto t1 = std::chrono::steady_clock::now();
                for (int i = 0; i < k; ++i) {
                    token = next_token(table, token, ++pos);
                    if (out[(pos - 1) % k] != token) {
                        fprintf(stderr, "FAIL: device loop K=%d pass %d: token %d, expected %d\n", k, pos, out[(pos - 1) % k], token);
                        return 1;
                    }
                }
                if (b * k < 50) continue;  // warm-up
                over.push_back((std::chrono::duration<double, std::micro>(t1 - t0).count() - k * (spin_ns / 1000.0)) / k);
            }
            printf("| K = %d (round %d) | %.2f |\n", k, round + 1, median(over));
            CHECK(cudaGraphExecDestroy(lexec));
            CHECK(cudaGraphDestroy(lg));
        }
    }
    printf("ok: every device-loop token matched the host's\n");

    // the pipeline: one pass queued ahead of the one whose token the host reads
    cudaGraph_t pg;
    cudaGraphExec_t pexec;
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
    advance_kernel<<<1, 160, 0, stream>>>(d_table, d_token, d_embd, d_pos);
    loop_pass_kernel<<<1, 1, 0, stream>>>(d_embd, d_pos, d_token, d_out, 1, spin_ns);
    CHECK(cudaStreamEndCapture(stream, &pg));
    CHECK(cudaGraphInstantiate(&pexec, pg, 0));
    int * h_tok;
    CHECK(cudaMallocHost(&h_tok, 2 * sizeof(int)));
    cudaEvent_t done[2];
    for (cudaEvent_t & e : done) CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    const auto host_work = [](double us) {  // stands in for the host's share of a pass
        const auto t0 = std::chrono::steady_clock::now();
        while (std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() < us) {}
    };
    // the small uploads of a pass, staged in pageable or pinned memory
    const size_t n_small = SIZES[0] + SIZES[2] + SIZES[3];
    unsigned char * d_small, * pinned_small, * pageable_small = (unsigned char *) malloc(n_small);
    CHECK(cudaMalloc(&d_small, n_small));
    CHECK(cudaMallocHost(&pinned_small, n_small));
    enum Uploads { NONE, PAGEABLE, PINNED };
    const char * upload_names[] = {"", ", 3 pageable uploads", ", 3 pinned uploads"};
    printf("\n| pass | host work us a pass | wall - spin us a pass |\n|---|---:|---:|\n");
    for (int round = 0; round < 2; ++round) {
        for (double work : {0.0, 30.0}) {
            for (int variant = 0; variant < 4; ++variant) {
                const bool pipelined = variant > 0;
                const Uploads uploads = variant == 2 ? PAGEABLE : variant == 3 ? PINNED : NONE;
                int token = 777, pos = 0;
                CHECK(cudaMemcpy(d_token, &token, sizeof(int), cudaMemcpyHostToDevice));
                CHECK(cudaMemcpy(d_pos, &pos, sizeof(int), cudaMemcpyHostToDevice));
                const auto queue = [&](int p) {
                    if (uploads != NONE) {
                        unsigned char * src = uploads == PINNED ? pinned_small : pageable_small;
                        memset(src, p & 0xff, n_small);  // the host fills them for this pass, as set_pass_inputs does
                        size_t offset = 0;
                        for (int i : {0, 2, 3}) {
                            CHECK(cudaMemcpyAsync(d_small + offset, src + offset, SIZES[i], cudaMemcpyHostToDevice, stream));
                            offset += SIZES[i];
                        }
                    }
                    CHECK(cudaGraphLaunch(pexec, stream));
                    CHECK(cudaMemcpyAsync(&h_tok[p % 2], d_token, sizeof(int), cudaMemcpyDeviceToHost, stream));
                    CHECK(cudaEventRecord(done[p % 2], stream));
                };
                const auto take = [&](int p) {  // waits for pass p's token, checks it, does the host's work
                    CHECK(cudaEventSynchronize(done[p % 2]));
                    token = next_token(table, token, ++pos);
                    if (h_tok[p % 2] != token) {
                        fprintf(stderr, "FAIL: %s pass %d: token %d, expected %d\n", pipelined ? "pipeline" : "round trip", p, h_tok[p % 2], token);
                        exit(1);
                    }
                    host_work(work);
                };
                const int n = passes + 50;
                const auto t0 = std::chrono::steady_clock::now();
                for (int p = 0; p < n; ++p) {
                    if (pipelined) {
                        if (p == 0) queue(0);
                        if (p + 1 < n) queue(p + 1);
                    } else {
                        queue(p);
                    }
                    take(p);
                }
                const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
                printf("| %s%s (round %d) | %.0f | %.2f |\n", pipelined ? "pipelined, one pass ahead" : "round trip",
                       upload_names[uploads], round + 1, work, us / n - spin_ns / 1000.0);
            }
        }
    }
    printf("ok: every pipelined token matched the host's\n");
    return 0;
}
