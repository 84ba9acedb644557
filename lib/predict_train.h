/* Training, saving and inspecting trained expert predictors (mcv-predict).
 * The runtime only needs lib/predict.h. */
#ifndef MCV_PREDICT_TRAIN_H
#define MCV_PREDICT_TRAIN_H

#include "mcv.h"
#include "model.h"
#include "predict.h"
#include "trace.h"
#include <stdint.h>

/* Training data gathered from routing traces: n tokens, each with the
 * hidden state entering every layer and the experts every layer chose. */
typedef struct mcv_pred_data {
	int64_t n;
	int L, H, k;
	const float *hidden;    /* [n][L][H] */
	const int32_t *experts; /* [n][L][k] */
	const uint8_t *val;     /* [n]: 1 = held out for validation */
	/* [n]: the token evaluated before token t (its routing is the
	 * previous-token context), -1 for none; NULL: none for any token */
	const int64_t *prev;
} mcv_pred_data;

typedef struct mcv_pred_train_params {
	int lookahead;  /* D >= 1 */
	int rank;       /* r >= 1 */
	int hidden;     /* width of the ReLU branch, 0: none (a purely low-rank map) */
	int context;    /* 1: also read the routing context (a version-2 file) */
	int epochs;
	int batch;      /* minibatch size */
	float lr;       /* Adam step */
	uint64_t seed;
	int verbose;    /* progress on stderr */
} mcv_pred_train_params;

mcv_pred_train_params mcv_pred_train_default_params(void);

/* Trains one low-rank map per (layer l, distance d), each with Adam on the
 * listwise cross-entropy between softmax(scores) and the routed set of
 * layer l + d, keeping the epoch with the best validation recall@k (epoch
 * 0 is the initialisation).  With context, the context tables start at
 * zero and Adam updates only the rows a minibatch touched (lazily: rows
 * not in the batch keep their moments).  init non-NULL: start from its router
 * baseline (rank >= n_expert reproduces it exactly, a smaller rank its
 * best rank-r approximation), else from small random weights.
 * Deterministic for a seed, independent of the thread count. */
int mcv_predictor_train(mcv_predictor **out, const mcv_trace_model *tm, const mcv_model *init,
			const mcv_pred_data *d, const mcv_pred_train_params *p, mcv_error *err);

/* Write a trained predictor (GGUF, see mcv(7) "Expert predictor"). */
int mcv_predictor_save(const mcv_predictor *p, const char *path, mcv_error *err);
/* Open a predictor file on its own (no model to check against). */
int mcv_predictor_open(mcv_predictor **out, const char *path, mcv_error *err);
/* The model a predictor belongs to (from its file, or the model). */
const mcv_trace_model *mcv_predictor_model(const mcv_predictor *p);
int mcv_predictor_rank(const mcv_predictor *p); /* 0 for the router */
int mcv_predictor_hidden(const mcv_predictor *p); /* ReLU branch width, 0: none */

/* The context of token t of d at layer l: rows[] as mcv_pred_ctx_rows
 * (at most (n_layer + l) * k); returns their number. */
int mcv_pred_data_rows(const mcv_predictor *p, const mcv_pred_data *d, int64_t t, int l, int *rows);

/* recall@k of scores against the k routed ids: |top-k(scores) & ids| / k. */
double mcv_pred_recall(const float *scores, int E, const int32_t *ids, int k);

#endif
