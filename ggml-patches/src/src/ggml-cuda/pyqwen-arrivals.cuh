// Arrival counters for kernels whose last CTA of a group does the group's final step (an atomicInc that
// wraps back to 0, so every launch leaves them at zero): one zeroed set per stream, as launches on a
// stream run one at a time. Made on first use, which runs before any CUDA graph capture (ggml warms its
// graphs up uncaptured); pyqwen-deltanet.cu's.
#pragma once

#include "common.cuh"

#include <algorithm>
#include <map>
#include <mutex>

inline unsigned int * pyqwen_arrivals(cudaStream_t stream, const int n) {
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
