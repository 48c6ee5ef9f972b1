/* Internal structures of the pyqwen runtime, shared by pq-*.c. */
#ifndef PQ_INTERNAL_H
#define PQ_INTERNAL_H

#include "pyqwen.h"

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "gguf.h"
#include "ggml-pyqwen.h"

#include <stdbool.h>

#define PQ_MAX_LAYERS 256
#define PQ_KV_PAD     256        /* attention spans the cache in steps of this many cells */
#define PQ_HISTORY    256        /* most previous tokens the in-graph repetition penalty sees */
#define PQ_SHORT_PASS_TOKENS 8   /* decode and draft verification: host embeddings, inputs pinned to the GPU */

/* Sets the thread-local error message; returns -1 so callers can `return pq_fail(...)`. */
int pq_fail(const char * fmt, ...);

struct pq_hparams {
    int32_t n_vocab;
    int32_t n_ctx_train;
    int32_t n_embd;
    int32_t n_layer;             /* trunk layers */
    int32_t n_layer_all;         /* trunk + MTP layers stored in the file */
    int32_t n_ff;
    int32_t n_head;
    int32_t n_head_kv;
    int32_t head_dim;
    int32_t n_rot;
    float   rope_base;
    float   norm_eps;
    int32_t full_attn_interval;
    /* Gated DeltaNet */
    int32_t conv_kernel;         /* d_conv */
    int32_t ssm_d_state;         /* head dim of k and v */
    int32_t ssm_n_k_heads;       /* group count */
    int32_t ssm_n_v_heads;       /* time step rank */
    int32_t ssm_d_inner;         /* n_v_heads * d_state */
};

static inline bool pq_is_recurrent(const struct pq_hparams * hp, int il) {
    return il < hp->n_layer && (il + 1) % hp->full_attn_interval != 0;
}

static inline int32_t pq_conv_channels(const struct pq_hparams * hp) {
    return 2 * hp->ssm_n_k_heads * hp->ssm_d_state + hp->ssm_d_inner;
}

struct pq_layer {
    struct ggml_tensor * attn_norm;
    struct ggml_tensor * post_norm;
    /* full attention */
    struct ggml_tensor * wq;     /* query and gate, interleaved per head */
    struct ggml_tensor * wk;
    struct ggml_tensor * wv;
    struct ggml_tensor * wo;
    struct ggml_tensor * q_norm;
    struct ggml_tensor * k_norm;
    /* Gated DeltaNet */
    struct ggml_tensor * wqkv;
    struct ggml_tensor * wz;
    struct ggml_tensor * conv1d;
    struct ggml_tensor * dt_bias;
    struct ggml_tensor * ssm_a;
    struct ggml_tensor * w_beta;
    struct ggml_tensor * w_alpha;
    struct ggml_tensor * ssm_norm;
    struct ggml_tensor * ssm_out;
    /* SwiGLU FFN */
    struct ggml_tensor * ffn_gate;
    struct ggml_tensor * ffn_up;
    struct ggml_tensor * ffn_down;
    /* Projections of one input stacked row-wise at load (pq-model.c, stack_rows); NULL where the
     * parts differ in type or are rotated, and the parts above are used instead. A stack's parts are
     * NULL. */
    struct ggml_tensor * in_proj;   /* DeltaNet: qkv | z | beta | alpha */
    struct ggml_tensor * qkv_proj;  /* attention: q (with gate) | k | v */
    struct ggml_tensor * gate_up;   /* FFN: gate | up */
    bool on_gpu;
};

struct pq_model {
    struct pq_hparams hp;
    struct pq_layer layers[PQ_MAX_LAYERS];
    struct ggml_tensor * tok_embd;
    struct ggml_tensor * output_norm;
    struct ggml_tensor * output;

    ggml_backend_t backend_cpu;
    ggml_backend_t backend_gpu;  /* NULL in CPU builds or when nothing is offloaded */
    int32_t n_threads;
    int32_t n_gpu_layers;
    bool    output_on_gpu;
    /* pq-context.c's pipelined decode: the GPU gathers a decode pass's embedding row from the token the pass
     * before wrote (ggml-patches 0010), the table pinned in host memory */
    bool    decode_pipeline;

    struct ggml_context * ctx_cpu;   /* tensor metadata, per placement */
    struct ggml_context * ctx_gpu;
    ggml_backend_buffer_t buf_cpu;
    ggml_backend_buffer_t buf_gpu;
    int64_t n_params;
    int64_t size_bytes;

    /* weights stored in the Hadamard basis (pq-linear.c) and their rotation length */
    struct pq_rotated { const struct ggml_tensor * w; int32_t n; } rotated[PQ_MAX_LAYERS * 24];
    int32_t n_rotated;
};

enum pq_out_mode {
    PQ_OUT_LAST   = 0,           /* logits of the last row */
    PQ_OUT_ALL    = 1,           /* logits of every row */
    PQ_OUT_ARGMAX = 2,           /* greedy token of the last row */
    PQ_OUT_SAMPLE = 3,           /* token drawn by the in-graph sampler (ggml_pyqwen_sample) */
};

/* The graph for one shape (tokens per pass, attended cache cells, logits wanted). */
struct pq_graph {
    int32_t n_tokens;
    int32_t n_kv;
    int32_t out_mode;            /* PQ_OUT_* */
    struct ggml_context * ctx;
    struct ggml_cgraph  * gf;
    struct ggml_tensor  * inp_tokens;   /* I32 [n_tokens]; NULL where inp_embd is set */
    struct ggml_tensor  * inp_embd;     /* F32 [n_embd, n_tokens], passes of <= PQ_SHORT_PASS_TOKENS; else NULL */
    struct ggml_tensor  * inp_pos;      /* I32 [n_tokens] */
    struct ggml_tensor  * inp_kv_idx;   /* I64 [n_tokens], cache cells written */
    struct ggml_tensor  * inp_mask;     /* F16 [n_kv, n_tokens]; NULL for one token */
    struct ggml_tensor  * mask;         /* what attention uses: inp_mask, or a view of pq_ctx.kv_seen */
    struct ggml_tensor  * inp_sampler;  /* F32 [GGML_PYQWEN_SAMPLE_N_PARAMS], PQ_OUT_SAMPLE only */
    struct ggml_tensor  * inp_history;  /* I32 [PQ_HISTORY], -1 = empty, PQ_OUT_SAMPLE only */
    struct ggml_tensor  * out;          /* logits or argmax */
};

struct pq_ctx {
    struct pq_model * model;
    struct pq_ctx_params params;
    int32_t n_past;

    /* Per layer: KV cache (attention) or conv + recurrent state (DeltaNet). */
    struct ggml_tensor * k_cache[PQ_MAX_LAYERS];
    struct ggml_tensor * v_cache[PQ_MAX_LAYERS];
    struct ggml_tensor * conv_state[PQ_MAX_LAYERS];
    struct ggml_tensor * ssm_state[PQ_MAX_LAYERS];
    /* F16 [cells]: 0 for the cells written so far, -inf beyond: the mask of one-token passes, kept
     * with the cache so that a decode step changes one cell instead of uploading a whole row */
    struct ggml_tensor * kv_seen;
    struct ggml_context * ctx_state_cpu;
    struct ggml_context * ctx_state_gpu;
    ggml_backend_buffer_t buf_state_cpu;
    ggml_backend_buffer_t buf_state_gpu;

    /* The scheduler and the one graph it is allocated for. Splitting a graph across backends
     * rewires its nodes to per-split input copies that the next ggml_backend_sched_reset frees,
     * so a graph is never allocated twice: a new shape builds a new graph (as llama.cpp does),
     * while the same shape replays the allocated one with new inputs. */
    ggml_backend_sched_t sched;
    struct pq_graph graph;

    pq_ctx_timings timings;

    /* the pipelined decode's two passes in flight: each one's token (pinned host memory) and completion */
    ggml_backend_buffer_t token_slots_buf;
    int32_t * token_slots;
    ggml_backend_event_t pass_done[2];

    /* host scratch */
    uint16_t * mask_buf;     /* ggml_fp16_t */
    uint16_t * seen_buf;     /* n_batch fp16 zeros: kv_seen of the cells a pass writes */
    float    * embd_buf;     /* PQ_SHORT_PASS_TOKENS rows of n_embd */
    int32_t  * pos_buf;
    int64_t  * idx_buf;
    int32_t    history_buf[PQ_HISTORY];
    float      sampler_buf[GGML_PYQWEN_SAMPLE_N_PARAMS];
};

struct ggml_cgraph * pq_build_graph(struct pq_ctx * ctx, struct pq_graph * g);

/* A context for a few tensors and a one-node graph (no data), and the runner that computes `out`
 * on a fresh CPU backend with n_threads, from inputs in[i] set to data[i] (ggml_nbytes each), into
 * result (ggml_nbytes(out)); inputs the op updates in place are read back into back[i] where
 * back (may be NULL) has a non-NULL entry. */
struct ggml_context * pq_small_ctx(void);
int pq_run_on_cpu(struct ggml_context * ctx, struct ggml_tensor * out, struct ggml_tensor ** in, const void ** data,
                  int n_in, int n_threads, void * result, void * const * back);

/* The sample op's parameter row (GGML_PYQWEN_SAMPLE_N_PARAMS floats) for these settings. */
void pq_sampler_params(const pq_sampling * s, float uniform, float * params);

/* pq-linear.c: rotated weights and GGML_TYPE_PQ_W4A8 */
int  pq_check_requires(const struct gguf_context * g);
/* the file's key marking tensor `name` as stored in the Hadamard basis, or -1 */
int64_t pq_rotation_key(const struct gguf_context * g, const char * name);
int  pq_load_rotation(struct pq_model * m, const struct gguf_context * g, const char * name, const struct ggml_tensor * w,
                      bool matmul_weight);
/* attaches tensor `name`'s codebook (pyqwen.w4a8.codebook.<name>, else the uniform code) to its pq_w4a8 blocks */
int  pq_load_codebook(const struct gguf_context * g, const char * name, void * blocks, int64_t n_blocks);
/* the type a weight of this type is stored as on a GPU outside the interleaved GEMV (pq_w4a8: Q8_0) */
enum ggml_type pq_gpu_weight_type(enum ggml_type type);
bool pq_gpu_can_multiply(ggml_backend_t gpu, const struct ggml_tensor * w, enum ggml_type type);
int32_t pq_rotation(const struct pq_model * m, const struct ggml_tensor * w);
/* w·x, rotating x first when w is stored in the Hadamard basis */
struct ggml_tensor * pq_linear(const struct pq_model * m, struct ggml_context * c, struct ggml_tensor * w, struct ggml_tensor * x);
struct ggml_tensor * pq_v_heads_grouped(struct ggml_context * c, struct ggml_tensor * x, int64_t n_k_heads);

#endif /* PQ_INTERNAL_H */
