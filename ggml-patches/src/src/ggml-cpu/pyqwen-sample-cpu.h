// CPU kernel of GGML_OP_PYQWEN_SAMPLE (include/ggml-pyqwen.h), called from ggml-cpu.c.
#pragma once

#include "ggml.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ggml_compute_params;

// threads the op can use: one per row
int    ggml_pyqwen_sample_n_tasks(const struct ggml_tensor * dst, int n_threads);
// bytes of work buffer for n_tasks threads
size_t ggml_pyqwen_sample_work_size(const struct ggml_tensor * dst, int n_tasks);
void   ggml_compute_forward_pyqwen_sample(const struct ggml_compute_params * params, struct ggml_tensor * dst);

#ifdef __cplusplus
}
#endif
