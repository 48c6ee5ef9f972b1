// FLASH_ATTN_EXT for decode and verify passes, split over the cache and merged (the kernels: pyqwen-fattn-kernel.cuh).
#pragma once

#include "common.cuh"

// FLASH_ATTN_EXT through pyqwen_fattn_decode where it applies (NVIDIA Ampere on, up to 8 rows a kv head, f16
// K and V of head size 128 or 256, no ALiBi, softcap or sinks); false: the caller runs upstream's kernels.
bool ggml_cuda_pyqwen_fattn_decode(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
