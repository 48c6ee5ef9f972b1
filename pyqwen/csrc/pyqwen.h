/* pyqwen native runtime: Qwen3.5 (qwen35 GGUF) inference on ggml.
 *
 * The declarations between the CDEF markers are the whole API seen from Python (cffi reads
 * them verbatim), so they stay plain C: no includes, macros or attributes inside.
 *
 * Conventions: functions returning int return 0 on success and -1 on failure, with the
 * reason in pq_last_error() (thread-local). Handles are opaque; every *_new/_load has a _free.
 */
#ifndef PYQWEN_H
#define PYQWEN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PQ_API

/* PYQWEN_CDEF_BEGIN */
typedef struct pq_model pq_model;
typedef struct pq_ctx   pq_ctx;

/* ggml type ids accepted for the KV cache (the numbers are ggml's enum ggml_type). */
enum pq_cache_type {
    PQ_CACHE_F32  = 0,
    PQ_CACHE_F16  = 1,
    PQ_CACHE_Q4_0 = 2,
    PQ_CACHE_Q8_0 = 8,
};

typedef struct pq_model_params {
    int32_t n_gpu_layers;   /* layers offloaded to the GPU; < 0 means all, 0 CPU only */
    int32_t n_threads;      /* CPU threads; <= 0 picks the number of cores */
    int32_t verbose;        /* let ggml log to stderr */
} pq_model_params;

typedef struct pq_model_info {
    int32_t n_vocab;
    int32_t n_ctx_train;
    int32_t n_embd;
    int32_t n_layer;        /* trunk layers, without the MTP block */
    int32_t n_head;
    int32_t n_head_kv;
    int32_t head_dim;
    int32_t n_ff;
    int32_t n_mtp_layers;   /* nextn_predict_layers stored in the file */
    int64_t n_params;
    int64_t size_bytes;     /* bytes of tensor data */
    int32_t n_gpu_layers;   /* layers actually on the GPU */
} pq_model_info;

typedef struct pq_ctx_params {
    int32_t n_ctx;          /* tokens the KV cache holds */
    int32_t n_batch;        /* tokens per forward pass during prefill */
    int32_t type_k;         /* enum pq_cache_type */
    int32_t type_v;
} pq_ctx_params;

typedef struct pq_sampling {
    float    temperature;   /* <= 0: greedy */
    int32_t  top_k;         /* <= 0: whole vocabulary */
    float    top_p;         /* >= 1: off */
    float    min_p;         /* <= 0: off */
    float    repeat_penalty;/* 1: off */
    int32_t  repeat_last_n; /* window of previous tokens the penalty looks at */
} pq_sampling;

/* Where a context's time went, accumulated over its life (pq_ctx_reset keeps them). */
typedef struct pq_ctx_timings {
    int64_t n_passes;       /* forward passes run */
    int64_t host_us;        /* host time in passes, outside waits for the device (pipelined decode: while the pass before runs) */
    int64_t wait_us;        /* time spent waiting for the device to finish a pass */
} pq_ctx_timings;

const char * pq_last_error(void);
const char * pq_version(void);
const char * pq_backend_name(void);     /* "CUDA" or "CPU": the backend the build has */

PQ_API int  pq_model_load(const char * path, const pq_model_params * params, pq_model ** out);
PQ_API void pq_model_free(pq_model * model);
PQ_API void pq_model_get_info(const pq_model * model, pq_model_info * info);
/* Free and total memory of the GPU the model uses; -1 when it runs on the CPU only. */
PQ_API int  pq_model_device_memory(const pq_model * model, int64_t * free_bytes, int64_t * total_bytes);

PQ_API int  pq_ctx_new(pq_model * model, const pq_ctx_params * params, pq_ctx ** out);
PQ_API void pq_ctx_free(pq_ctx * ctx);
/* Forget everything: KV cache, convolution and recurrent states. */
PQ_API void pq_ctx_reset(pq_ctx * ctx);
PQ_API int32_t pq_ctx_n_past(const pq_ctx * ctx);
/* Bytes of device/host buffers the context holds (KV cache, states, compute buffers). */
PQ_API int64_t pq_ctx_memory_bytes(const pq_ctx * ctx);
PQ_API void pq_ctx_get_timings(const pq_ctx * ctx, pq_ctx_timings * out);

/* Run n_tokens tokens after the current position, in passes of at most n_batch tokens.
 * logits_out (may be NULL) receives n_vocab floats per token when logits_all, else only the
 * last token's. */
PQ_API int pq_ctx_eval(pq_ctx * ctx, const int32_t * tokens, int32_t n_tokens, int32_t logits_all, float * logits_out);

/* Decode up to n_steps tokens autoregressively, starting by feeding `token`; every step feeds the
 * token it picked. Greedy (temperature <= 0, no penalty) is an argmax in the graph, anything else
 * the in-graph sampler: uniforms[i] in [0, 1) drives step i's draw (unused when greedy), and the
 * repetition penalty looks at the tail of history + the tokens picked so far. Stops after picking a
 * token listed in stop, or one token later: with every layer on a CUDA GPU and no penalty the steps
 * run pipelined, and a stop token picked before the last step has then been fed, so the token after
 * it is returned too. Every token returned but the last has been fed (n_past counts them). Returns
 * the number of tokens written to out_tokens, or -1 on error. */
PQ_API int32_t pq_ctx_generate(pq_ctx * ctx, int32_t token, int32_t n_steps, const pq_sampling * sampling,
                               const int32_t * history, int32_t n_history, const float * uniforms,
                               const int32_t * stop, int32_t n_stop, int32_t * out_tokens);

/* Pick a token from one row of logits on the host (the same sampler as above). */
PQ_API int pq_sample_logits(const float * logits, int32_t n_vocab, const pq_sampling * sampling,
                            const int32_t * history, int32_t n_history, float uniform,
                            int32_t * out_token);
/* The same on the first CUDA device (the sampler's CUDA kernel, for checking it against the CPU's);
 * fails when the build has no CUDA or no device answers. */
PQ_API int pq_sample_logits_gpu(const float * logits, int32_t n_vocab, const pq_sampling * sampling,
                                const int32_t * history, int32_t n_history, float uniform,
                                int32_t * out_token);
/* Quantize n_rows rows of n_per_row floats to a ggml type (ggml's own quantizers, no importance
 * matrix) and back. pq_quantize returns the bytes written, or -1 if the type cannot hold rows
 * of that length. */
PQ_API int64_t pq_quantize(int32_t type, const float * src, void * dst, int64_t n_rows, int64_t n_per_row);
PQ_API int     pq_dequantize(int32_t type, const void * src, float * dst, int64_t n);
PQ_API int64_t pq_type_row_size(int32_t type, int64_t n_per_row);
/* GGML_TYPE_PQ_W4A8 (ggml-patches/): attach a 16-entry codebook (NULL: the uniform code - 8) to
 * n_blocks blocks, as the loader does with the pyqwen.w4a8.codebook.<tensor> metadata. */
PQ_API int pq_w4a8_set_codebook(void * blocks, int64_t n_blocks, const float * codebook);
/* n values of GGML_TYPE_PQ_W4A8 blocks (codebook attached) as GGML_TYPE_Q8_0 blocks, as the loader
 * stores such weights on a GPU: the same int8 values, the channel scale in fp16. */
PQ_API int pq_w4a8_to_q8_0(const void * blocks, void * out, int64_t n);
/* One-node CPU graphs for the tests: x -> x·H per n columns (GGML_OP_PYQWEN_HADAMARD), and the
 * product of n_rows weight rows of a ggml type with n_cols activation columns, the activations
 * first rotated when hadamard > 0 (what the model graph does for rotated weights);
 * out is n_cols x n_rows. */
PQ_API int pq_hadamard(const float * x, int64_t n_per_row, int64_t n_rows, int32_t n, float * out);
PQ_API int pq_mul_mat(int32_t type, const void * w, int64_t n_rows, int64_t n_per_row, const float * x, int64_t n_cols,
                      int32_t hadamard, float * out);
/* The DeltaNet input step (GGML_OP_PYQWEN_DELTANET_PREP) for n_tokens tokens: token t's row of y
 * (width floats) holds q|k|v at column 0 and the beta and alpha projections at beta_col and alpha_col;
 * conv_state (channels x (conv_kernel - 1)) is advanced in place; out gets each token's q|k|v after
 * conv, SiLU and norms, then g (n_v_heads x n_tokens), then beta. */
PQ_API int pq_deltanet_prep(const float * y, int64_t width, int64_t n_tokens, int64_t beta_col, int64_t alpha_col,
                            float * conv_state, const float * conv_w, int32_t conv_kernel, const float * dt_bias,
                            const float * a, int32_t n_k_heads, int32_t n_v_heads, int32_t head_dim, float eps, float * out);
/* PYQWEN_CDEF_END */

#ifdef __cplusplus
}
#endif

#endif /* PYQWEN_H */
