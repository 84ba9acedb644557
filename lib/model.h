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

struct mcv_les_params;

typedef struct mcv_model_params {
	int n_threads; /* 0: all cores */
	/* A memory budget and Lookahead Expert Scheduling (lib/les.h); NULL
	 * or les->mem == 0: every weight resident through the mapping. */
	const struct mcv_les_params *les;
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

/* Observe routing (routing traces, predictor training): fn is called for
 * every MoE layer of every evaluated row, right after the router chose,
 * with the k expert ids in top-k order and their final weights.  Called
 * from the thread running the layer, rows in order.  NULL: off. */
typedef void (*mcv_route_hook_fn)(void *user, int layer, int pos, const int32_t *ids,
				  const float *weights, int k);
void mcv_ctx_set_route_hook(mcv_ctx *c, mcv_route_hook_fn fn, void *user);
/* Replace routing (replay of a recorded trace, lib/les_replay.h): fn may
 * rewrite the k ids (distinct, in [0, n_expert)) and weights of every row
 * right after the router chose, before the route hook observes them and
 * the experts run.  NULL: off. */
typedef void (*mcv_route_override_fn)(void *user, int layer, int pos, int32_t *ids,
				      float *weights, int k);
void mcv_ctx_set_route_override(mcv_ctx *c, mcv_route_override_fn fn, void *user);

/* Observe every weight product (calibration: importance matrices).  fn is
 * called just before Y = X W^T with `weights` = the data pointer of the
 * bound GGUF tensor (mcv_gguf_tensor.data), the product's first row `row0`
 * and row count in that tensor (for a 3-D expert tensor, matrix row0/ne[1];
 * fused projections are called once per part with the same X), and X[m][n]
 * the input rows: only the experts the router really chose, with their
 * tokens.  PROCESS-WIDE (every context) and called concurrently from the
 * threads running experts, so fn must be thread-safe.  NULL: off. */
typedef void (*mcv_matmul_hook_fn)(void *user, const void *weights, int64_t row0, int64_t nrows,
				   const float *X, int64_t m, int64_t n);
void mcv_set_matmul_hook(mcv_matmul_hook_fn fn, void *user);

#endif
