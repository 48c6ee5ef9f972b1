// pyqwen-embed.cu: a decode pass's embedding row, gathered on the GPU from the token the pass before wrote
// there, so that the host can queue the next pass before it has read that token (pq-context.c's pipelined
// decode: the GPU no longer idles while the host reads a token, embeds it, uploads and launches). The table
// stays in host memory, as pyqwen keeps it, in a pinned buffer (ggml_backend_cuda_host_buffer_type), which the
// GPU reads through the same pointer (unified addressing): one row a pass crosses PCIe.
#include "common.cuh"
#include "convert.cuh"
#include "ggml-backend-impl.h"
#include "ggml-cuda.h"

bool ggml_backend_cuda_pyqwen_embed_supported(const struct ggml_tensor * table) {
    return table->buffer && ggml_backend_buffer_get_type(table->buffer) == ggml_backend_cuda_host_buffer_type() &&
           (table->type == GGML_TYPE_F32 || ggml_get_to_fp32_cuda(table->type) != nullptr) &&
           ggml_is_contiguous(table) && table->nb[1] % 16 == 0 && (uintptr_t) table->data % 16 == 0;
}

// dst = the bytes of row *token of the table (nb1 bytes a row, a multiple of 16). The token is read before any
// thread writes: the graph's allocator may have placed the token (an output) where dst (a spent input) was.
static __global__ void pyqwen_embed_copy_row(const char * table, const int32_t * token, const int64_t nb1, char * dst) {
    __shared__ int32_t id;
    if (threadIdx.x == 0) id = *token;
    __syncthreads();
    const int4 * row = (const int4 *) (table + (int64_t) id * nb1);
    for (int64_t i = threadIdx.x; i < nb1 / 16; i += blockDim.x) {
        ((int4 *) dst)[i] = row[i];
    }
}

void ggml_backend_cuda_pyqwen_embed_token(ggml_backend_t backend, const struct ggml_tensor * table, const struct ggml_tensor * token,
                                          struct ggml_tensor * dst) {
    ggml_backend_cuda_context * ctx = (ggml_backend_cuda_context *) backend->context;
    ggml_cuda_set_device(ctx->device);
    cudaStream_t stream = ctx->stream();
    GGML_ASSERT(token->type == GGML_TYPE_I32 && dst->type == GGML_TYPE_F32 && dst->ne[0] == table->ne[0]);
    if (table->type == GGML_TYPE_F32) {
        pyqwen_embed_copy_row<<<1, 256, 0, stream>>>((const char *) table->data, (const int32_t *) token->data, table->nb[1], (char *) dst->data);
    } else {
        // the row's raw blocks into a scratch buffer of the pool (stream-ordered), then ggml's converter
        ggml_cuda_pool_alloc<char> row(ctx->pool(), table->nb[1]);
        pyqwen_embed_copy_row<<<1, 256, 0, stream>>>((const char *) table->data, (const int32_t *) token->data, table->nb[1], row.get());
        ggml_get_to_fp32_cuda(table->type)(row.get(), (float *) dst->data, table->ne[0], stream);
    }
    CUDA_CHECK(cudaGetLastError());
}
