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
 *    A version-2 file also reads the routing context: what the routers
 *    already chose when layer l starts (the previous token at every layer,
 *    this token at the layers below l); mcv_pred_session keeps it for a
 *    running context.
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

/* The routing known when layer l of a token starts: k ids per layer, in
 * any order; ids outside [0, n_expert) (e.g. -1) are ignored. */
typedef struct mcv_pred_context {
	const int32_t *prev; /* [n_layer][k]: the previous token's experts; NULL: none */
	const int32_t *cur;  /* [l][k]: this token's experts at layers 0..l-1; NULL: none */
} mcv_pred_context;

/* 1 when p reads the routing context (a version-2 file), else 0. */
int mcv_predictor_context(const mcv_predictor *p);
/* mcv_predictor_scores with the routing context (c may be NULL: no
 * routing known, as for a first token).  Predictors without context
 * ignore c. */
int mcv_predictor_scores_ctx(const mcv_predictor *p, int l, int d, const float *h,
			     const mcv_pred_context *c, float *scores, mcv_error *err);

/* A predictor at work in a running context: it remembers the routing of
 * the last two tokens at every layer (from the context's route hook) and
 * predicts with it.  One per context, used on the thread running it. */
typedef struct mcv_pred_session mcv_pred_session;

/* p must outlive the session. */
int mcv_pred_session_init(mcv_pred_session **out, const mcv_predictor *p, mcv_error *err);
void mcv_pred_session_free(mcv_pred_session *s);
/* Observe c's routing.  A route hook already set on c is kept and called
 * after ours; detach puts it back (unless someone replaced ours since). */
void mcv_pred_session_attach(mcv_pred_session *s, mcv_ctx *c);
void mcv_pred_session_detach(mcv_pred_session *s);
/* An mcv_route_hook_fn (user = the session): record one row's routing.
 * attach installs it; public for callers that route by other means. */
void mcv_pred_session_route(void *user, int layer, int pos, const int32_t *ids, const float *w,
			    int k);
/* An mcv_les_predict_fn (user = the session): scores of layer l + d from
 * h entering layer l of the token being evaluated, with its context. */
int mcv_pred_session_predict(void *user, int l, int d, const float *h, float *scores);

#endif
