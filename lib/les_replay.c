/* Replay of recorded routing onto a full-size model (les_replay.h). */
#include "les_replay.h"
#include "les.h"
#include "predict.h"
#include "trace.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct mcv_replay {
	mcv_trace *t;
	mcv_trace_model tm, fm; /* the trace's model, the full model */
	int R, seg;
	int64_t n_tok, tok;
	mcv_model *pm;          /* the trained model, for its predictor */
	mcv_predictor *pred;
	float *hid, *psc;       /* scratch of the predictor (model thread only) */
	int rc;
	mcv_error err;
};

/* splitmix64: a fixed, well-mixed hash, so r does not depend on libc */
static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static int sub_of(const mcv_replay *r, int layer, int e, int64_t token)
{
	const uint64_t s = r->seg > 0 ? (uint64_t)(token / r->seg) : 0;
	return (int)(mix(((uint64_t)layer << 44) ^ ((uint64_t)e << 24) ^ s) % (uint64_t)r->R);
}

int mcv_replay_open(mcv_replay **out, const char *trace_path, const mcv_model *full,
		    int segment_len, mcv_error *err)
{
	*out = NULL;
	mcv_replay *r = calloc(1, sizeof *r);
	if (!r)
		return mcv_error_set(err, MCV_ENOMEM, "out of memory");
	int rc = mcv_trace_model_from_gguf(&r->fm, mcv_model_gguf(full), err);
	if (rc) {
		free(r);
		return rc;
	}
	if ((rc = mcv_trace_open(&r->t, trace_path, err))) {
		free(r);
		return rc;
	}
	r->tm = *mcv_trace_model_of(r->t);
	r->n_tok = mcv_trace_n_tokens(r->t);
	if (r->tm.n_expert > r->fm.n_expert || r->fm.n_expert % r->tm.n_expert)
		rc = mcv_error_set(err, MCV_EINVAL,
				   "%s: the trace has %d experts per layer, which does not divide the "
				   "model's %d", trace_path, r->tm.n_expert, r->fm.n_expert);
	else if (r->tm.n_expert_used != r->fm.n_expert_used)
		rc = mcv_error_set(err, MCV_EINVAL,
				   "%s: the trace routes %d experts per token, the model %d",
				   trace_path, r->tm.n_expert_used, r->fm.n_expert_used);
	else if (r->n_tok < 1)
		rc = mcv_error_set(err, MCV_EINVAL, "%s: the trace holds no tokens", trace_path);
	if (rc) {
		mcv_replay_free(r);
		return rc;
	}
	r->R = r->fm.n_expert / r->tm.n_expert;
	r->seg = segment_len > 0 ? segment_len : 0;
	*out = r;
	return 0;
}

void mcv_replay_free(mcv_replay *r)
{
	if (!r)
		return;
	mcv_predictor_free(r->pred);
	mcv_model_free(r->pm);
	mcv_trace_close(r->t);
	free(r->hid);
	free(r->psc);
	free(r);
}

int64_t mcv_replay_n_tokens(const mcv_replay *r)
{
	return r->n_tok;
}

int mcv_replay_set_proving(mcv_replay *r, const char *model_path, const char *predictor_path,
			   mcv_error *err)
{
	mcv_model_params mp = mcv_model_default_params();
	int rc = mcv_model_load(&r->pm, model_path, &mp, err);
	if (rc)
		return rc;
	if ((rc = mcv_trace_check_model(r->t, mcv_model_gguf(r->pm), err))) {
		mcv_error_prefix(err, "--replay-model %s", model_path);
		return rc;
	}
	if (mcv_trace_hidden_type(r->t) < 0)
		return mcv_error_set(err, MCV_EINVAL,
				     "the trace holds no hidden states, which predictions need");
	rc = predictor_path ? mcv_predictor_load(&r->pred, predictor_path, r->pm, err)
			    : mcv_predictor_router(&r->pred, r->pm, err);
	if (rc)
		return rc;
	r->hid = malloc(sizeof(float) * (size_t)r->tm.n_embd);
	r->psc = malloc(sizeof(float) * (size_t)r->tm.n_expert);
	if (!r->hid || !r->psc)
		return mcv_error_set(err, MCV_ENOMEM, "out of memory");
	return 0;
}

const char *mcv_replay_predictor_kind(const mcv_replay *r)
{
	return r->pred ? mcv_predictor_kind(r->pred) : "none";
}

int mcv_replay_map(const mcv_replay *r, int64_t token, int layer, int32_t *ids, float *weights,
		   mcv_error *err)
{
	if (token < 0 || token >= r->n_tok || layer < 0 || layer >= r->fm.n_layer)
		return mcv_error_set(err, MCV_EINVAL,
				     "replay: token %lld layer %d is outside the trace (%lld tokens)",
				     (long long)token, layer, (long long)r->n_tok);
	const int pl = layer % r->tm.n_layer, k = r->tm.n_expert_used;
	const int32_t *e = mcv_trace_experts(r->t, token, pl);
	if (!e)
		return mcv_error_set(err, MCV_EFORMAT, "replay: token %lld has no record", (long long)token);
	for (int j = 0; j < k; j++)
		ids[j] = e[j] * r->R + sub_of(r, layer, e[j], token);
	if (weights)
		return mcv_trace_weights(r->t, token, pl, weights);
	return 0;
}

static void override(void *user, int layer, int pos, int32_t *ids, float *weights, int k)
{
	mcv_replay *r = user;
	(void)k; /* equal to the trace's, checked at open */
	mcv_error e;
	int rc = mcv_replay_map(r, pos, layer, ids, weights, &e);
	if (rc && !r->rc) {
		r->rc = rc;
		r->err = e;
	}
}

static int predict(void *user, int l, int d, const float *h, float *scores)
{
	mcv_replay *r = user;
	(void)h; /* the full model's hidden state follows its random weights */
	const int tgt = l + d, pt = tgt % r->tm.n_layer, ps = pt - d;
	if (ps < 0 || r->tok < 0 || r->tok >= r->n_tok)
		return -1;
	mcv_error e;
	/* a predictor with routing context reads the trace's: the previous
	 * token's experts and this token's below ps (predict.h) */
	const mcv_pred_context c = { r->tok > 0 ? mcv_trace_experts(r->t, r->tok - 1, 0) : NULL,
				     mcv_trace_experts(r->t, r->tok, 0) };
	if (mcv_trace_hidden(r->t, r->tok, ps, r->hid) ||
	    mcv_predictor_scores_ctx(r->pred, ps, d, r->hid, &c, r->psc, &e))
		return -1;
	for (int x = 0; x < r->fm.n_expert; x++)
		scores[x] = -INFINITY;
	for (int x = 0; x < r->tm.n_expert; x++)
		scores[x * r->R + sub_of(r, tgt, x, r->tok)] = r->psc[x];
	return 0;
}

static int predict_none(void *user, int l, int d, const float *h, float *scores)
{
	(void)user, (void)l, (void)d, (void)h, (void)scores;
	return -1;
}

void mcv_replay_attach(mcv_replay *r, mcv_ctx *c)
{
	mcv_ctx_set_route_override(c, override, r);
	mcv_les *les = mcv_ctx_les(c);
	if (!les)
		return;
	if (r->pred)
		mcv_les_set_predictor(les, predict, r, mcv_predictor_kind(r->pred));
	else
		mcv_les_set_predictor(les, predict_none, r, "none");
}

void mcv_replay_set_token(mcv_replay *r, int64_t token)
{
	r->tok = token;
}

int mcv_replay_status(const mcv_replay *r, mcv_error *err)
{
	if (r->rc && err)
		*err = r->err;
	return r->rc;
}
