// Standalone CUDA benches (fattn_decode_bench.cu, deltanet_step_bench.cu): what `enqueue` launches on a
// stream, captured once as a CUDA graph and replayed back to back, as ggml replays a decode step.
#pragma once

#include <cuda_runtime.h>

// Microseconds a replay: 5 warm-up replays, then `reps` between two events. `edit` may change the captured
// graph's nodes before it is instantiated.
template <typename F, typename E = void (*)(cudaGraph_t)>
static double graph_us_per_replay(cudaStream_t st, const int reps, F && enqueue, E && edit = [](cudaGraph_t) {}) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed));
    enqueue();
    CUDA_CHECK(cudaStreamEndCapture(st, &g));
    edit(g);
    CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
    for (int i = 0; i < 5; ++i) {
        CUDA_CHECK(cudaGraphLaunch(ge, st));
    }
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    CUDA_CHECK(cudaEventRecord(e0, st));
    for (int i = 0; i < reps; ++i) {
        CUDA_CHECK(cudaGraphLaunch(ge, st));
    }
    CUDA_CHECK(cudaEventRecord(e1, st));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float ms;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    CUDA_CHECK(cudaGraphExecDestroy(ge));
    CUDA_CHECK(cudaGraphDestroy(g));
    return 1e3*ms/reps;
}
