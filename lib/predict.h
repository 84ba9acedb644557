/* Expert predictors for Lookahead Expert Scheduling: from the hidden state
 * entering layer l, score the experts that layer l + d (d = 1..lookahead)
 * will route to, so the runtime can read them before the router fires.
 *
 * Two kinds behind one interface:
 *  - the router baseline (no training): layer l+d's own router applied to
 *    the hidden state entering layer l, RMS-normalised with layer l+d's
 *    post-attention norm weights (what that router will see, minus the
 *    layers in between);
 *  - a trained predictor file written by `mcv-predict train` (GGUF,
 *    general.type "mcv.predictor", see mcv(7) "Expert predictor").
 *
 * A prediction only decides what is read early; it never changes which
 * experts run, so output does not depend on the predictor. */
#ifndef MCV_PREDICT_H
#define MCV_PREDICT_H

#include "mcv.h"
#include "model.h"

typedef struct mcv_predictor mcv_predictor;

/* The router baseline for model m (a qwen35moe model; dense is an error). */
int mcv_predictor_router(mcv_predictor **out, const mcv_model *m, mcv_error *err);
/* A trained predictor file; its shapes and model fingerprint must match m,
 * otherwise a one-line error saying what differs. */
int mcv_predictor_load(mcv_predictor **out, const char *path, const mcv_model *m,
		       mcv_error *err);
void mcv_predictor_free(mcv_predictor *p);

/* Largest d the predictor answers (the router baseline: n_layer - 1). */
int mcv_predictor_max_lookahead(const mcv_predictor *p);
/* "router" or "trained". */
const char *mcv_predictor_kind(const mcv_predictor *p);

/* scores[n_expert] for layer l + d from h = float[n_embd], the residual
 * stream entering layer l (the input of its attn_norm).  Higher = more
 * likely routed.  MCV_EINVAL when l + d >= n_layer or d is outside
 * 1..max_lookahead.  Thread-safe for concurrent calls (no shared scratch). */
int mcv_predictor_scores(const mcv_predictor *p, int l, int d, const float *h, float *scores,
			 mcv_error *err);

#endif
