// CPU dot product of GGML_TYPE_PQ_W4A8 rows with Q8_0 activations (include/ggml-pyqwen.h),
// registered in ggml-cpu.c's type traits.
#pragma once

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

void ggml_vec_dot_pq_w4a8_q8_0(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc);

#ifdef __cplusplus
}
#endif
