/* The language model: qwen35 (dense) and qwen35moe (MoE) from a GGUF, with
 * llama.cpp's tensor names and metadata keys, and an evaluation context that
 * holds the KV cache (attention layers) and recurrent state (DeltaNet layers).
 *
 * Weights stay in their file type and in the mapping; matmuls run on the
 * quantized blocks (quant/quant.h). */
#ifndef MCV_MODEL_H
#define MCV_MODEL_H

#include "gguf.h"
#include "mcv.h"
#include <stdint.h>

typedef struct mcv_model mcv_model;
typedef struct mcv_ctx mcv_ctx;

typedef struct mcv_model_params {
	int n_threads; /* 0: all cores */
} mcv_model_params;

mcv_model_params mcv_model_default_params(void);
/* Fails with a one-line message for: unreadable/hostile file, unknown
 * architecture, missing or mis-shaped tensor, missing metadata key. */
int mcv_model_load(mcv_model **out, const char *path, const mcv_model_params *p,
		   mcv_error *err);
void mcv_model_free(mcv_model *m);

const mcv_gguf *mcv_model_gguf(const mcv_model *m);
const char *mcv_model_arch(const mcv_model *m); /* "qwen35" or "qwen35moe" */
int mcv_model_n_vocab(const mcv_model *m);
int mcv_model_n_embd(const mcv_model *m);
int mcv_model_n_layer(const mcv_model *m);
int mcv_model_n_ctx_train(const mcv_model *m);

typedef struct mcv_ctx_params {
	int n_ctx;   /* tokens the KV cache holds; 0: min(4096, trained) */
	int n_batch; /* prefill chunk; 0: 256 */
} mcv_ctx_params;

mcv_ctx_params mcv_ctx_default_params(void);
int mcv_ctx_init(mcv_ctx **out, mcv_model *m, const mcv_ctx_params *p, mcv_error *err);
void mcv_ctx_free(mcv_ctx *c);
void mcv_ctx_reset(mcv_ctx *c);  /* empty the caches, position 0 */
int mcv_ctx_pos(const mcv_ctx *c); /* tokens evaluated so far */

/* Append n tokens at the current position and run them (a batched prefill
 * when n > 1).  Afterwards mcv_ctx_logits() holds the last token's logits. */
int mcv_ctx_eval(mcv_ctx *c, const int32_t *tokens, int n, mcv_error *err);
/* Append n rows of input embeddings (float[n][n_embd], e.g. visual tokens)
 * with explicit M-RoPE positions pos[n][4] = (t, h, w, 0). */
int mcv_ctx_eval_embd(mcv_ctx *c, const float *embd, const int32_t *pos, int n,
		      mcv_error *err);
const float *mcv_ctx_logits(const mcv_ctx *c); /* float[n_vocab] */

/* Observe the residual stream (parity tests, debugging): fn is called with
 * h[n_embd] after every layer of every evaluated row (layer 0..n_layer-1,
 * pos = the row's index in the sequence) and, with layer = n_layer, with
 * the final-normed last row the logits are computed from.  NULL: off. */
typedef void (*mcv_layer_hook_fn)(void *user, int layer, int pos, const float *h, int n_embd);
void mcv_ctx_set_layer_hook(mcv_ctx *c, mcv_layer_hook_fn fn, void *user);

#endif
