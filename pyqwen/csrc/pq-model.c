/* Loading a qwen35 GGUF: metadata, validation, placement of weights on CPU or GPU. */
#include "pq-internal.h"

#ifdef PYQWEN_WITH_CUDA
#include "ggml-cuda.h"
#endif

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static _Thread_local char pq_error[1024];

int pq_fail(const char * fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pq_error, sizeof(pq_error), fmt, ap);
    va_end(ap);
    return -1;
}

const char * pq_last_error(void) { return pq_error; }
const char * pq_version(void) { return "0.1.0"; }

const char * pq_backend_name(void) {
#ifdef PYQWEN_WITH_CUDA
    return "CUDA";
#else
    return "CPU";
#endif
}

/* ggml logs go to stderr only when asked for. Error lines are kept, so that if ggml aborts the
 * process anyway (a CUDA error, an assert) the reason is printed instead of lost. */
static bool pq_verbose;
static char pq_ggml_errors[2048];

static void pq_log(enum ggml_log_level level, const char * text, void * user) {
    (void) user;
    if (pq_verbose) {
        fputs(text, stderr);
    } else if (level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_CONT) {
        const size_t used = strlen(pq_ggml_errors), room = sizeof(pq_ggml_errors) - 1;
        if (strlen(text) >= room) return;
        if (used + strlen(text) > room) pq_ggml_errors[0] = '\0';  /* keep the latest lines */
        strncat(pq_ggml_errors, text, room - strlen(pq_ggml_errors));
    }
}

static void pq_on_abort(const char * message) {
    if (!pq_verbose && pq_ggml_errors[0]) fprintf(stderr, "pyqwen: last ggml errors:\n%s", pq_ggml_errors);
    fprintf(stderr, "%s\n", message);
}

/* ---- metadata ---- */

static const char * ARCH = "qwen35";

static int64_t kv_int(const struct gguf_context * g, int64_t id) {
    switch (gguf_get_kv_type(g, id)) {
        case GGUF_TYPE_UINT8:  return gguf_get_val_u8(g, id);
        case GGUF_TYPE_INT8:   return gguf_get_val_i8(g, id);
        case GGUF_TYPE_UINT16: return gguf_get_val_u16(g, id);
        case GGUF_TYPE_INT16:  return gguf_get_val_i16(g, id);
        case GGUF_TYPE_UINT32: return gguf_get_val_u32(g, id);
        case GGUF_TYPE_INT32:  return gguf_get_val_i32(g, id);
        case GGUF_TYPE_UINT64: return (int64_t) gguf_get_val_u64(g, id);
        case GGUF_TYPE_INT64:  return gguf_get_val_i64(g, id);
        default:               return INT64_MIN;
    }
}

/* Reads "<arch>.<suffix>" as an integer; missing keys take dflt unless it is INT64_MIN. */
static int get_int(const struct gguf_context * g, const char * suffix, int64_t dflt, int32_t * out) {
    char key[128];
    snprintf(key, sizeof(key), "%s.%s", ARCH, suffix);
    int64_t id = gguf_find_key(g, key);
    if (id < 0) {
        if (dflt == INT64_MIN) return pq_fail("GGUF metadata key %s is missing", key);
        *out = (int32_t) dflt;
        return 0;
    }
    int64_t v = kv_int(g, id);
    if (v == INT64_MIN || v < 0 || v > INT32_MAX) return pq_fail("GGUF metadata key %s is not a valid integer", key);
    *out = (int32_t) v;
    return 0;
}

static int get_float(const struct gguf_context * g, const char * suffix, float dflt, bool required, float * out) {
    char key[128];
    snprintf(key, sizeof(key), "%s.%s", ARCH, suffix);
    int64_t id = gguf_find_key(g, key);
    if (id < 0) {
        if (required) return pq_fail("GGUF metadata key %s is missing", key);
        *out = dflt;
        return 0;
    }
    if (gguf_get_kv_type(g, id) != GGUF_TYPE_FLOAT32) return pq_fail("GGUF metadata key %s is not a float32", key);
    *out = gguf_get_val_f32(g, id);
    return 0;
}

static int read_hparams(const struct gguf_context * g, struct pq_hparams * hp) {
    int64_t id = gguf_find_key(g, "general.architecture");
    if (id < 0 || gguf_get_kv_type(g, id) != GGUF_TYPE_STRING) return pq_fail("not a model file: general.architecture is missing");
    const char * arch = gguf_get_val_str(g, id);
    if (strcmp(arch, ARCH) != 0) {
        return pq_fail("unsupported architecture '%s': pyqwen runs '%s' (Qwen3.5 dense) models", arch, ARCH);
    }
    int32_t n_mtp = 0;
    if (get_int(g, "block_count", INT64_MIN, &hp->n_layer_all) ||
        get_int(g, "nextn_predict_layers", 0, &n_mtp) ||
        get_int(g, "context_length", INT64_MIN, &hp->n_ctx_train) ||
        get_int(g, "embedding_length", INT64_MIN, &hp->n_embd) ||
        get_int(g, "feed_forward_length", INT64_MIN, &hp->n_ff) ||
        get_int(g, "attention.head_count", INT64_MIN, &hp->n_head) ||
        get_int(g, "attention.head_count_kv", INT64_MIN, &hp->n_head_kv) ||
        get_int(g, "full_attention_interval", 4, &hp->full_attn_interval) ||
        get_int(g, "ssm.conv_kernel", INT64_MIN, &hp->conv_kernel) ||
        get_int(g, "ssm.inner_size", INT64_MIN, &hp->ssm_d_inner) ||
        get_int(g, "ssm.state_size", INT64_MIN, &hp->ssm_d_state) ||
        get_int(g, "ssm.time_step_rank", INT64_MIN, &hp->ssm_n_v_heads) ||
        get_int(g, "ssm.group_count", INT64_MIN, &hp->ssm_n_k_heads) ||
        get_float(g, "attention.layer_norm_rms_epsilon", 1e-6f, true, &hp->norm_eps) ||
        get_float(g, "rope.freq_base", 1e7f, false, &hp->rope_base)) {
        return -1;
    }
    if (hp->n_head == 0 || hp->n_head_kv == 0 || hp->n_embd == 0) return pq_fail("GGUF metadata has zero heads or width");
    if (get_int(g, "attention.key_length", hp->n_embd / hp->n_head, &hp->head_dim) ||
        get_int(g, "rope.dimension_count", hp->head_dim, &hp->n_rot)) {
        return -1;
    }
    hp->n_layer = hp->n_layer_all - n_mtp;
    if (hp->n_layer <= 0 || hp->n_layer_all > PQ_MAX_LAYERS) return pq_fail("unsupported layer count %d", hp->n_layer_all);
    if (hp->full_attn_interval <= 0) return pq_fail("full_attention_interval must be positive");
    if (hp->n_head % hp->n_head_kv != 0) return pq_fail("head_count %d is not a multiple of head_count_kv %d", hp->n_head, hp->n_head_kv);
    if (hp->ssm_n_k_heads == 0 || hp->ssm_n_v_heads % hp->ssm_n_k_heads != 0) return pq_fail("ssm.time_step_rank must be a multiple of ssm.group_count");
    if (hp->ssm_d_inner != hp->ssm_n_v_heads * hp->ssm_d_state) return pq_fail("ssm.inner_size != time_step_rank * state_size");
    if (hp->n_rot > hp->head_dim || hp->n_rot % 2) return pq_fail("rope.dimension_count %d does not fit head dim %d", hp->n_rot, hp->head_dim);
    if (hp->conv_kernel < 2) return pq_fail("ssm.conv_kernel must be at least 2");
    return 0;
}

/* ---- tensors ---- */

struct tensor_req {
    struct ggml_tensor ** dst;
    char name[96];
    int64_t ne[2];               /* expected shape; ne[1] == 0 for 1-D */
    int layer;                   /* -1 for tensors outside the blocks */
    bool optional;
    bool f32_only;               /* element-wise parameters must stay f32 */
    /* found while loading */
    const struct ggml_tensor * src;  /* the file's tensor; NULL if absent */
    bool gpu;
    enum ggml_type type;             /* how it is stored: the file's type, or pq_gpu_weight_type() of it on a GPU */
    struct ggml_tensor * into;       /* the tensor its bytes go to: its own, or a stack (stack_rows) */
    size_t at;                       /* byte offset in `into` */
};

static bool type_supported(enum ggml_type t) {
    if ((int) t < 0 || t >= GGML_TYPE_COUNT) return false;
    const struct ggml_type_traits * tt = ggml_get_type_traits(t);
    return tt->blck_size > 0 && tt->type_size > 0 && ggml_get_type_traits_cpu(t)->vec_dot != NULL;
}

/* The output's requirement when it loads the token table (tied embeddings, the output on the GPU). */
static bool is_table_copy(const struct pq_model * m, const struct tensor_req * r) {
    return r->dst == &m->output && strcmp(r->name, "token_embd.weight") == 0;
}

static void collect_requirements(struct pq_model * m, struct tensor_req * reqs, int * n_req) {
    const struct pq_hparams * hp = &m->hp;
    int n = 0;
#define REQ(dst_, layer_, opt_, f32_, ne0_, ne1_, ...) do { \
        struct tensor_req * r = &reqs[n++]; r->dst = (dst_); r->layer = (layer_); r->optional = (opt_); r->f32_only = (f32_); \
        r->ne[0] = (ne0_); r->ne[1] = (ne1_); snprintf(r->name, sizeof(r->name), __VA_ARGS__); } while (0)
    const int64_t E = hp->n_embd, V = hp->n_vocab, D = hp->head_dim;
    REQ(&m->tok_embd, -1, false, false, E, V, "token_embd.weight");
    REQ(&m->output_norm, -1, false, true, E, 0, "output_norm.weight");
    REQ(&m->output, -1, true, false, E, V, "output.weight");
    for (int il = 0; il < hp->n_layer; ++il) {
        struct pq_layer * L = &m->layers[il];
        REQ(&L->attn_norm, il, false, true, E, 0, "blk.%d.attn_norm.weight", il);
        REQ(&L->post_norm, il, false, true, E, 0, "blk.%d.post_attention_norm.weight", il);
        if (pq_is_recurrent(hp, il)) {
            const int64_t C = pq_conv_channels(hp), HV = hp->ssm_n_v_heads;
            REQ(&L->wqkv,     il, false, false, E, C, "blk.%d.attn_qkv.weight", il);
            REQ(&L->wz,       il, false, false, E, hp->ssm_d_inner, "blk.%d.attn_gate.weight", il);
            REQ(&L->conv1d,   il, false, true, hp->conv_kernel, C, "blk.%d.ssm_conv1d.weight", il);
            REQ(&L->dt_bias,  il, false, true, HV, 0, "blk.%d.ssm_dt.bias", il);
            REQ(&L->ssm_a,    il, false, true, HV, 0, "blk.%d.ssm_a", il);
            REQ(&L->w_beta,   il, false, false, E, HV, "blk.%d.ssm_beta.weight", il);
            REQ(&L->w_alpha,  il, false, false, E, HV, "blk.%d.ssm_alpha.weight", il);
            REQ(&L->ssm_norm, il, false, true, hp->ssm_d_state, 0, "blk.%d.ssm_norm.weight", il);
            REQ(&L->ssm_out,  il, false, false, hp->ssm_d_inner, E, "blk.%d.ssm_out.weight", il);
        } else {
            REQ(&L->wq,     il, false, false, E, 2 * D * hp->n_head, "blk.%d.attn_q.weight", il);
            REQ(&L->wk,     il, false, false, E, D * hp->n_head_kv, "blk.%d.attn_k.weight", il);
            REQ(&L->wv,     il, false, false, E, D * hp->n_head_kv, "blk.%d.attn_v.weight", il);
            REQ(&L->wo,     il, false, false, D * hp->n_head, E, "blk.%d.attn_output.weight", il);
            REQ(&L->q_norm, il, false, true, D, 0, "blk.%d.attn_q_norm.weight", il);
            REQ(&L->k_norm, il, false, true, D, 0, "blk.%d.attn_k_norm.weight", il);
        }
        REQ(&L->ffn_gate, il, false, false, E, hp->n_ff, "blk.%d.ffn_gate.weight", il);
        REQ(&L->ffn_up,   il, false, false, E, hp->n_ff, "blk.%d.ffn_up.weight", il);
        REQ(&L->ffn_down, il, false, false, hp->n_ff, E, "blk.%d.ffn_down.weight", il);
    }
#undef REQ
    *n_req = n;
}

static int check_tensor(const struct ggml_tensor * t, const struct tensor_req * r) {
    const int64_t ne1 = r->ne[1] ? r->ne[1] : 1;
    if (t->ne[0] != r->ne[0] || t->ne[1] != ne1 || t->ne[2] != 1 || t->ne[3] != 1) {
        return pq_fail("tensor %s has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld]", r->name,
                       (long long) t->ne[0], (long long) t->ne[1], (long long) t->ne[2], (long long) t->ne[3],
                       (long long) r->ne[0], (long long) ne1);
    }
    if (!type_supported(t->type)) return pq_fail("tensor %s has unsupported type %d", r->name, (int) t->type);
    if (r->f32_only && t->type != GGML_TYPE_F32) return pq_fail("tensor %s must be f32, found %s", r->name, ggml_type_name(t->type));
    return 0;
}

static size_t stored_bytes(const struct tensor_req * r) {
    return ggml_row_size(r->type, r->src->ne[0]) * (size_t) ggml_nrows(r->src);
}

/* The tensor's bytes from the file into its place (through `scratch` for device memory), with a
 * pq_w4a8 codebook attached, and the expansion to r->type where that differs from the file's type
 * (only on a GPU). */
static int read_tensor_data(FILE * f, size_t offset, const struct gguf_context * g, const struct tensor_req * r,
                            void ** scratch, size_t * scratch_size) {
    const size_t nbytes = ggml_nbytes(r->src), stored = stored_bytes(r);
    const bool host = ggml_backend_buffer_is_host(r->into->buffer), expand = r->type != r->src->type;
    void * dst = (char *) r->into->data + r->at;
    if (!host) {
        const size_t need = nbytes + (expand ? stored : 0);
        if (*scratch_size < need) {
            free(*scratch);
            *scratch = malloc(need);
            *scratch_size = *scratch ? need : 0;
            if (!*scratch) return pq_fail("out of host memory reading %s", r->name);
        }
        dst = *scratch;
    }
    if (fseeko(f, (off_t) offset, SEEK_SET) != 0 || fread(dst, 1, nbytes, f) != nbytes) {
        return pq_fail("could not read the data of tensor %s (file truncated?)", r->name);
    }
    if (r->src->type == GGML_TYPE_PQ_W4A8 &&
        pq_load_codebook(g, r->name, dst, ggml_nelements(r->src) / GGML_PYQWEN_W4A8_BLOCK)) {
        return -1;
    }
    if (expand) {
        void * out = (char *) dst + nbytes;
        if (host || r->src->type != GGML_TYPE_PQ_W4A8 || r->type != GGML_TYPE_Q8_0) {
            return pq_fail("tensor %s: no conversion from %s to %s here", r->name, ggml_type_name(r->src->type), ggml_type_name(r->type));
        }
        ggml_pyqwen_w4a8_to_q8_0(dst, out, ggml_nelements(r->src));
        dst = out;
    }
    if (!host) ggml_backend_tensor_set(r->into, dst, r->at, stored);
    return 0;
}

static struct tensor_req * find_req(struct tensor_req * reqs, int n_req, struct ggml_tensor ** dst) {
    for (int i = 0; i < n_req; ++i) {
        if (reqs[i].dst == dst) return &reqs[i];
    }
    return NULL;
}

/* Projections of the same input, stacked row-wise into one weight so that one matrix product (one
 * activation quantization, one GEMV launch on the GPU) replaces several: possible when they share
 * type, width and placement and none is stored rotated. Sets *stack, or leaves it NULL. */
static void stack_rows(struct pq_model * m, const struct gguf_context * g, struct tensor_req * reqs, int n_req,
                       struct ggml_tensor ** stack, const char * name, int il, struct ggml_tensor ** parts[], int n_parts) {
    struct tensor_req * r[4];
    int64_t rows = 0;
    for (int i = 0; i < n_parts; ++i) {
        r[i] = find_req(reqs, n_req, parts[i]);
        if (!r[i] || !r[i]->src) return;
        const struct ggml_tensor * a = r[i]->src, * b = r[0]->src;
        if (r[i]->type != r[0]->type || a->type != b->type || a->type >= GGML_TYPE_COUNT || a->ne[0] != b->ne[0] ||
            r[i]->gpu != r[0]->gpu || pq_rotation_key(g, r[i]->name) >= 0) {
            return;
        }
        rows += a->ne[1];
    }
    *stack = ggml_new_tensor_2d(r[0]->gpu ? m->ctx_gpu : m->ctx_cpu, r[0]->type, r[0]->src->ne[0], rows);
    ggml_format_name(*stack, "blk.%d.%s.stacked", il, name);
    size_t at = 0;
    for (int i = 0; i < n_parts; ++i) {
        r[i]->into = *stack;
        r[i]->at = at;
        at += stored_bytes(r[i]);
    }
}

static int init_backends(struct pq_model * m, const pq_model_params * p) {
    m->n_threads = p->n_threads > 0 ? p->n_threads : (int32_t) sysconf(_SC_NPROCESSORS_ONLN);
    if (m->n_threads <= 0) m->n_threads = 1;
    m->backend_cpu = ggml_backend_cpu_init();
    if (!m->backend_cpu) return pq_fail("could not initialise the CPU backend");
    ggml_backend_cpu_set_n_threads(m->backend_cpu, m->n_threads);
    m->n_gpu_layers = 0;
#ifdef PYQWEN_WITH_CUDA
    if (p->n_gpu_layers != 0 && ggml_backend_cuda_get_device_count() > 0) {
        m->backend_gpu = ggml_backend_cuda_init(0);
        if (!m->backend_gpu) return pq_fail("could not initialise the CUDA backend on device 0");
        m->n_gpu_layers = p->n_gpu_layers < 0 || p->n_gpu_layers > m->hp.n_layer ? m->hp.n_layer : p->n_gpu_layers;
        /* llama.cpp's convention: the output layer counts as one more layer past the blocks */
        m->output_on_gpu = p->n_gpu_layers < 0 || p->n_gpu_layers > m->hp.n_layer;
    }
#endif
    return 0;
}

/* The host's weights (with every layer and the output on the GPU: the token embeddings only) go to pinned
 * memory there, which the GPU reads as well: pq-context.c's pipelined decode gathers each pass's row from it.
 * PYQWEN_DECODE_PIPELINE=0 keeps them in ordinary memory, and every decode pass a round trip. */
static ggml_backend_buffer_type_t cpu_weight_buffer_type(const struct pq_model * m) {
#ifdef PYQWEN_WITH_CUDA
    const char * pipeline = getenv("PYQWEN_DECODE_PIPELINE");
    const bool output_on_gpu = m->output_on_gpu && m->output != m->tok_embd;   /* not tied to the host's table */
    if (m->backend_gpu && m->n_gpu_layers == m->hp.n_layer && output_on_gpu && !(pipeline && strcmp(pipeline, "0") == 0)) {
        return ggml_backend_cuda_host_buffer_type();
    }
#endif
    return ggml_backend_get_default_buffer_type(m->backend_cpu);
}

/* The GPU weights go to the interleaved buffer type: Q4_0/Q8_0/Q4_K/Q6_K/W4A8 matrices re-laid out once for
 * the skinny GEMV of ggml-patches 0006, with its prologue fusions (other tensors are stored as in
 * ggml's CUDA buffer). PYQWEN_GEMV=upstream keeps ggml's layout and kernels, for comparisons. */
static ggml_backend_buffer_type_t gpu_weight_buffer_type(const struct pq_model * m) {
#ifdef PYQWEN_WITH_CUDA
    const char * gemv = getenv("PYQWEN_GEMV");
    if (!gemv || strcmp(gemv, "upstream") != 0) return ggml_backend_cuda_gemv_il_buffer_type(0);
#endif
    return ggml_backend_get_default_buffer_type(m->backend_gpu);
}

/* Whether the GPU weight buffer stores w interleaved, so that the GEMV multiplies it whatever its type:
 * GGML_TYPE_PQ_W4A8 stays 4-bit only there (elsewhere pq_gpu_weight_type expands it to Q8_0). */
static bool gemv_stores(const struct pq_model * m, const struct ggml_tensor * w) {
#ifdef PYQWEN_WITH_CUDA
    return gpu_weight_buffer_type(m) == ggml_backend_cuda_gemv_il_buffer_type(0) && ggml_backend_cuda_gemv_il_stores(0, w);
#else
    (void) m; (void) w;
    return false;
#endif
}

int pq_model_load(const char * path, const pq_model_params * params, pq_model ** out) {
    *out = NULL;
    pq_verbose = params->verbose != 0;
    ggml_log_set(pq_log, NULL);
    ggml_set_abort_callback(pq_on_abort);

    FILE * f = fopen(path, "rb");
    if (!f) return pq_fail("cannot open %s", path);
    fseeko(f, 0, SEEK_END);
    const int64_t file_size = ftello(f);
    char magic[4] = {0};
    fseeko(f, 0, SEEK_SET);
    if (fread(magic, 1, 4, f) != 4 || memcmp(magic, "GGUF", 4) != 0) {
        fclose(f);
        return pq_fail("%s is not a GGUF file", path);
    }

    struct ggml_context * meta = NULL;
    struct gguf_init_params gp = { .no_alloc = true, .ctx = &meta };
    struct gguf_context * g = gguf_init_from_file(path, gp);
    if (!g) {
        fclose(f);
        return pq_fail("%s is a damaged or truncated GGUF file (its header could not be parsed)", path);
    }

    struct pq_model * m = calloc(1, sizeof(*m));
    struct tensor_req * reqs = calloc(PQ_MAX_LAYERS * 24 + 8, sizeof(*reqs));
    void * scratch = NULL;
    size_t scratch_size = 0;
    int rc = -1;
    if (!m || !reqs) { pq_fail("out of memory"); goto done; }
    if (read_hparams(g, &m->hp) || pq_check_requires(g)) goto done;

    struct ggml_tensor * embd = ggml_get_tensor(meta, "token_embd.weight");
    if (!embd) { pq_fail("tensor token_embd.weight is missing"); goto done; }
    m->hp.n_vocab = (int32_t) embd->ne[1];

    /* every tensor's data must lie inside the file */
    const size_t data_offset = gguf_get_data_offset(g);
    for (int64_t i = 0; i < gguf_get_n_tensors(g); ++i) {
        struct ggml_tensor * t = ggml_get_tensor(meta, gguf_get_tensor_name(g, i));
        if ((int64_t) (data_offset + gguf_get_tensor_offset(g, i) + ggml_nbytes(t)) > file_size) {
            pq_fail("%s is truncated: tensor %s ends past the end of the file", path, gguf_get_tensor_name(g, i));
            goto done;
        }
    }

    if (init_backends(m, params)) goto done;

    int n_req = 0;
    collect_requirements(m, reqs, &n_req);
    const size_t ctx_size = (size_t) (n_req + 3 * m->hp.n_layer + 1) * ggml_tensor_overhead();  /* + stacks */
    struct ggml_init_params ip = { .mem_size = ctx_size, .mem_buffer = NULL, .no_alloc = true };
    m->ctx_cpu = ggml_init(ip);
    if (m->backend_gpu) m->ctx_gpu = ggml_init(ip);

    /* the model's tensors by name; others in the file (the pyqwen.requires marker, pq-linear.c) stay unread */
    for (int i = 0; i < n_req; ++i) {
        struct tensor_req * r = &reqs[i];
        r->src = ggml_get_tensor(meta, r->name);
        if (!r->src && r->dst == &m->output && m->output_on_gpu) {
            /* tied embeddings with the output on the GPU: a GPU copy of the table, as upstream's -ngl loads it;
             * the lookup keeps the host's */
            snprintf(r->name, sizeof(r->name), "token_embd.weight");
            r->src = ggml_get_tensor(meta, r->name);
        }
        if (!r->src) {
            if (r->optional) continue;
            pq_fail("tensor %s is missing", r->name);
            goto done;
        }
        if (check_tensor(r->src, r)) goto done;
        r->gpu = m->backend_gpu && (r->layer >= 0 ? r->layer >= m->hp.n_layer - m->n_gpu_layers : m->output_on_gpu);
        /* the embedding lookup is a gather: it stays on the CPU like upstream's input layer */
        if (r->dst == &m->tok_embd) r->gpu = false;
        const bool interleaved = r->gpu && gemv_stores(m, r->src);
        r->type = r->gpu && !interleaved ? pq_gpu_weight_type(r->src->type) : r->src->type;
        if (r->gpu && !interleaved && !pq_gpu_can_multiply(m->backend_gpu, r->src, r->type)) {
            r->gpu = false;
            r->type = r->src->type;
        }
        if (is_table_copy(m, r) && !r->gpu) r->src = NULL;  /* no second copy on the host: the output stays tied */
    }
    for (int il = 0; il < m->hp.n_layer; ++il) {
        struct pq_layer * L = &m->layers[il];
        if (pq_is_recurrent(&m->hp, il)) {
            struct ggml_tensor ** in[] = { &L->wqkv, &L->wz, &L->w_beta, &L->w_alpha };
            stack_rows(m, g, reqs, n_req, &L->in_proj, "in_proj", il, in, 4);
        } else {
            struct ggml_tensor ** qkv[] = { &L->wq, &L->wk, &L->wv };
            stack_rows(m, g, reqs, n_req, &L->qkv_proj, "qkv_proj", il, qkv, 3);
        }
        struct ggml_tensor ** ffn[] = { &L->ffn_gate, &L->ffn_up };
        stack_rows(m, g, reqs, n_req, &L->gate_up, "gate_up", il, ffn, 2);
    }
    for (int i = 0; i < n_req; ++i) {
        struct tensor_req * r = &reqs[i];
        if (!r->src) continue;
        if (!r->into) {  /* not stacked: a tensor of its own */
            r->into = *r->dst = ggml_new_tensor(r->gpu ? m->ctx_gpu : m->ctx_cpu, r->type, GGML_MAX_DIMS, r->src->ne);
            ggml_set_name(r->into, r->name);
            if (pq_load_rotation(m, g, r->name, r->into, !r->f32_only && r->dst != &m->tok_embd)) goto done;
        }
        if (r->layer >= 0) m->layers[r->layer].on_gpu = r->gpu;
        if (is_table_copy(m, r)) continue;  /* counted once */
        m->n_params += ggml_nelements(r->src);
        m->size_bytes += ggml_nbytes(r->src);
    }
    if (!m->output) {
        m->output = m->tok_embd;   /* tied embeddings */
    }

    m->buf_cpu = ggml_backend_alloc_ctx_tensors_from_buft(m->ctx_cpu, cpu_weight_buffer_type(m));
    if (!m->buf_cpu) { pq_fail("out of host memory for the weights"); goto done; }
    ggml_backend_buffer_set_usage(m->buf_cpu, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    if (m->ctx_gpu && ggml_get_first_tensor(m->ctx_gpu)) {
        m->buf_gpu = ggml_backend_alloc_ctx_tensors_from_buft(m->ctx_gpu, gpu_weight_buffer_type(m));
        if (!m->buf_gpu) { pq_fail("out of GPU memory for the weights"); goto done; }
        ggml_backend_buffer_set_usage(m->buf_gpu, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    }

    for (int i = 0; i < n_req; ++i) {
        const struct tensor_req * r = &reqs[i];
        if (!r->src) continue;
        const int64_t ti = gguf_find_tensor(g, r->name);
        if (read_tensor_data(f, data_offset + gguf_get_tensor_offset(g, ti), g, r, &scratch, &scratch_size)) goto done;
    }
#ifdef PYQWEN_WITH_CUDA
    m->decode_pipeline = m->backend_gpu && ggml_backend_cuda_pyqwen_embed_supported(m->tok_embd);
#endif
    rc = 0;

done:
    free(scratch);
    free(reqs);
    fclose(f);
    gguf_free(g);
    ggml_free(meta);
    if (rc != 0) {
        pq_model_free(m);
        return -1;
    }
    *out = m;
    return 0;
}

void pq_model_free(pq_model * m) {
    if (!m) return;
    if (m->buf_cpu) ggml_backend_buffer_free(m->buf_cpu);
    if (m->buf_gpu) ggml_backend_buffer_free(m->buf_gpu);
    if (m->ctx_cpu) ggml_free(m->ctx_cpu);
    if (m->ctx_gpu) ggml_free(m->ctx_gpu);
    if (m->backend_gpu) ggml_backend_free(m->backend_gpu);
    if (m->backend_cpu) ggml_backend_free(m->backend_cpu);
    free(m);
}

void pq_model_get_info(const pq_model * m, pq_model_info * info) {
    const struct pq_hparams * hp = &m->hp;
    info->n_vocab = hp->n_vocab;
    info->n_ctx_train = hp->n_ctx_train;
    info->n_embd = hp->n_embd;
    info->n_layer = hp->n_layer;
    info->n_head = hp->n_head;
    info->n_head_kv = hp->n_head_kv;
    info->head_dim = hp->head_dim;
    info->n_ff = hp->n_ff;
    info->n_mtp_layers = hp->n_layer_all - hp->n_layer;
    info->n_params = m->n_params;
    info->size_bytes = m->size_bytes;
    info->n_gpu_layers = m->n_gpu_layers;
}

int pq_model_device_memory(const pq_model * m, int64_t * free_bytes, int64_t * total_bytes) {
    if (!m->backend_gpu) return -1;
    size_t free_b = 0, total_b = 0;
    ggml_backend_dev_memory(ggml_backend_get_device(m->backend_gpu), &free_b, &total_b);
    *free_bytes = (int64_t) free_b;
    *total_bytes = (int64_t) total_b;
    return 0;
}
