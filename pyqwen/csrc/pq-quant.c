/* Weight quantization through ggml's own quantizers, for the converter and the tests. */
#include "pq-internal.h"

#include <string.h>

static int check_type(int32_t type, int64_t n_per_row) {
    if (type < 0 || type >= GGML_TYPE_COUNT || ggml_get_type_traits((enum ggml_type) type)->blck_size <= 0) {
        return pq_fail("unknown ggml type %d", type);
    }
    const int64_t blck = ggml_blck_size((enum ggml_type) type);
    if (n_per_row <= 0 || n_per_row % blck != 0) {
        return pq_fail("%s needs rows that are a multiple of %lld values, got %lld", ggml_type_name((enum ggml_type) type),
                       (long long) blck, (long long) n_per_row);
    }
    return 0;
}

int64_t pq_type_row_size(int32_t type, int64_t n_per_row) {
    if (check_type(type, n_per_row)) return -1;
    return (int64_t) ggml_row_size((enum ggml_type) type, n_per_row);
}

int64_t pq_quantize(int32_t type, const float * src, void * dst, int64_t n_rows, int64_t n_per_row) {
    if (check_type(type, n_per_row)) return -1;
    if (ggml_quantize_requires_imatrix((enum ggml_type) type)) {
        return pq_fail("%s needs an importance matrix", ggml_type_name((enum ggml_type) type));
    }
    if (ggml_is_quantized((enum ggml_type) type) && !ggml_get_type_traits((enum ggml_type) type)->from_float_ref) {
        return pq_fail("%s has no quantizer (it is only made by pyqwen-convert)", ggml_type_name((enum ggml_type) type));
    }
    ggml_quantize_init((enum ggml_type) type);
    return (int64_t) ggml_quantize_chunk((enum ggml_type) type, src, dst, 0, n_rows, n_per_row, NULL);
}

int pq_dequantize(int32_t type, const void * src, float * dst, int64_t n) {
    if (check_type(type, n)) return -1;
    const struct ggml_type_traits * tt = ggml_get_type_traits((enum ggml_type) type);
    if (type == GGML_TYPE_F32) {
        memcpy(dst, src, sizeof(float) * (size_t) n);
        return 0;
    }
    if (!tt->to_float) return pq_fail("no dequantizer for %s", ggml_type_name((enum ggml_type) type));
    tt->to_float(src, dst, n);
    return 0;
}
