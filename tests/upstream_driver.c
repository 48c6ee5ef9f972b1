/* A minimal client of upstream llama.cpp (libllama), for tests/upstream.py.

   upstream_driver MODEL.gguf N_PREDICT LOGITS.bin TOKEN...

   Loads MODEL (CPU), evaluates the prompt TOKENs in one batch, writes the logits of every
   prompt position to LOGITS.bin (float32, n_prompt x n_vocab), then decodes N_PREDICT
   greedy (argmax) tokens and prints them on one line of stdout. A model that llama.cpp
   refuses makes it print llama.cpp's own log on stderr and exit 2. */
#include "llama.h"

#include <stdio.h>
#include <stdlib.h>

static void log_to_stderr(enum ggml_log_level level, const char * text, void * user_data) {
    (void) user_data;
    if (level >= GGML_LOG_LEVEL_WARN || getenv("UPSTREAM_DRIVER_VERBOSE")) fputs(text, stderr);
}

static int argmax(const float * v, int n) {
    int best = 0;
    for (int i = 1; i < n; i++) if (v[i] > v[best]) best = i;
    return best;
}

int main(int argc, char ** argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s MODEL.gguf N_PREDICT LOGITS.bin TOKEN...\n", argv[0]);
        return 1;
    }
    const int n_predict = atoi(argv[2]);
    const int n_prompt = argc - 4;
    llama_token * tokens = malloc(sizeof(llama_token) * (size_t) (n_prompt + n_predict));
    for (int i = 0; i < n_prompt; i++) tokens[i] = atoi(argv[4 + i]);

    llama_log_set(log_to_stderr, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "upstream_driver: llama.cpp could not load %s\n", argv[1]);
        return 2;
    }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t) (n_prompt + n_predict + 16);
    cp.n_batch = cp.n_ctx;
    cp.n_ubatch = cp.n_ctx;
    cp.n_threads = cp.n_threads_batch = 2;
    cp.type_k = cp.type_v = GGML_TYPE_F32;
    struct llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "upstream_driver: cannot create a context\n");
        return 3;
    }

    struct llama_batch batch = llama_batch_init(n_prompt, 0, 1);
    for (int i = 0; i < n_prompt; i++) {
        batch.token[i] = tokens[i];
        batch.pos[i] = i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = 1;
    }
    batch.n_tokens = n_prompt;
    if (llama_decode(ctx, batch) != 0) {
        fprintf(stderr, "upstream_driver: prompt decode failed\n");
        return 4;
    }
    FILE * f = fopen(argv[3], "wb");
    if (!f) {
        fprintf(stderr, "upstream_driver: cannot write %s\n", argv[3]);
        return 5;
    }
    for (int i = 0; i < n_prompt; i++) fwrite(llama_get_logits_ith(ctx, i), sizeof(float), (size_t) n_vocab, f);
    fclose(f);

    llama_token next = argmax(llama_get_logits_ith(ctx, n_prompt - 1), n_vocab);
    for (int i = 0; i < n_predict; i++) {
        printf(i ? " %d" : "%d", next);
        if (i + 1 == n_predict) break;
        if (llama_decode(ctx, llama_batch_get_one(&next, 1)) != 0) {
            fprintf(stderr, "upstream_driver: decode failed at step %d\n", i);
            return 4;
        }
        next = argmax(llama_get_logits_ith(ctx, -1), n_vocab);
    }
    printf("\n");
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    free(tokens);
    return 0;
}
