/* Expert predictors: the router baseline, predictor files, scoring.
 *
 * File (mcv(7) "Expert predictor"): GGUF v3, general.type "mcv.predictor",
 * mcv.predictor.model.* naming the model as a routing trace does, and per
 * (layer l, distance d), l + d < n_layer, the F32 tensors
 *   pred.<l>.<d>.norm  [H]        RMS-norm weight
 *   pred.<l>.<d>.down  [H, r]     r rows of H
 *   pred.<l>.<d>.up    [r, E]     E rows of r
 *   pred.<l>.<d>.bias  [E]
 * scores = up (down (rmsnorm(h) * norm)) + bias; with mcv.predictor.hidden
 * m > 0 also
 *   pred.<l>.<d>.hdown [H, m]    pred.<l>.<d>.hbias [m]    pred.<l>.<d>.hup [m, E]
 * and scores += hup relu(hdown x + hbias).  Version 2 adds the routing
 * context (mcv.predictor.context "routing"): with S = n_layer + l slots,
 *   pred.<l>.<d>.cout  [E, S*E]    pred.<l>.<d>.chid  [m, S*E] (m > 0)
 * whose rows of the experts in the context are added to the scores and to
 * the ReLU branch's input (predict_impl.h). */
#include "predict_impl.h"
#include "predict_train.h"

#include "model_impl.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int model_info(mcv_trace_model *tm, const mcv_model *m, mcv_error *err)
{
	if (!m->hp.moe)
		return mcv_error_set(err, MCV_EUNSUPPORTED,
				     "expert predictors need a MoE model (%s has no experts)", m->arch);
	return mcv_trace_model_from_gguf(tm, m->gguf, err);
}

int mcv_predictor_router(mcv_predictor **out, const mcv_model *m, mcv_error *err)
{
	*out = NULL;
	mcv_trace_model tm;
	int rc = model_info(&tm, m, err);
	if (rc)
		return rc;
	for (int l = 0; l < m->hp.n_layer; l++)
		if (!m->layers[l].gate_inp.data || !m->layers[l].post_norm.data)
			return mcv_error_set(err, MCV_ENOTFOUND, "layer %d has no router", l);
	mcv_predictor *p = calloc(1, sizeof *p);
	if (!p)
		return mcv_error_set(err, MCV_ENOMEM, "out of memory");
	p->kind = MCV_PRED_ROUTER;
	p->tm = tm;
	p->H = m->hp.n_embd;
	p->E = m->hp.n_expert;
	p->L = m->hp.n_layer;
	p->D = p->L - 1;
	p->eps = m->hp.eps;
	p->m = m;
	*out = p;
	return 0;
}

size_t mcv_pred_map_size(const mcv_predictor *p)
{
	return (size_t)p->H + (size_t)p->rank * p->H + (size_t)p->E * p->rank + (size_t)p->E +
	       (size_t)p->hid * ((size_t)p->H + 1 + (size_t)p->E);
}

int mcv_pred_slots(const mcv_predictor *p, int l) { return p->ctx ? p->L + l : 0; }

size_t mcv_pred_map_size_at(const mcv_predictor *p, int l)
{
	return mcv_pred_map_size(p) +
	       (size_t)mcv_pred_slots(p, l) * p->E * ((size_t)p->E + (size_t)p->hid);
}

static void map_bind(mcv_pred_map *mp, const mcv_predictor *p, float *base, int l)
{
	mp->norm = base;
	mp->down = base + p->H;
	mp->up = mp->down + (size_t)p->rank * p->H;
	mp->bias = mp->up + (size_t)p->E * p->rank;
	if (p->hid > 0) {
		mp->hdown = mp->bias + p->E;
		mp->hbias = mp->hdown + (size_t)p->hid * p->H;
		mp->hup = mp->hbias + p->hid;
	}
	mp->S = mcv_pred_slots(p, l);
	if (mp->S > 0) {
		mp->cout = base + mcv_pred_map_size(p);
		if (p->hid > 0)
			mp->chid = mp->cout + (size_t)mp->S * p->E * p->E;
	}
}

static int alloc_common(mcv_predictor **out, const mcv_trace_model *tm, int D, int rank, int hid,
			int ctx, float eps, mcv_error *err)
{
	*out = NULL;
	if (tm->n_layer < 2 || D < 1 || D >= tm->n_layer || rank < 1 || tm->n_expert < 1 || hid < 0 ||
	    hid > (1 << 16) ||
	    tm->n_embd < 1 || tm->n_embd > (1 << 24) || rank > (1 << 16) || tm->n_expert > (1 << 20))
		return mcv_error_set(err, MCV_EINVAL,
				     "bad predictor shape: %d layers, lookahead %d, rank %d, %d experts, hidden %" PRId64,
				     tm->n_layer, D, rank, tm->n_expert, tm->n_embd);
	mcv_predictor *p = calloc(1, sizeof *p);
	if (!p || !(p->maps = calloc((size_t)tm->n_layer * D, sizeof *p->maps))) {
		free(p);
		return mcv_error_set(err, MCV_ENOMEM, "out of memory");
	}
	p->kind = MCV_PRED_TRAINED;
	p->tm = *tm;
	p->H = (int)tm->n_embd;
	p->E = tm->n_expert;
	p->L = tm->n_layer;
	p->D = D;
	p->rank = rank;
	p->hid = hid;
	p->ctx = ctx != 0;
	p->eps = eps;
	*out = p;
	return 0;
}

int mcv_pred_alloc(mcv_predictor **out, const mcv_trace_model *tm, int D, int rank, int hid,
		   int ctx, float eps, mcv_error *err)
{
	mcv_predictor *p;
	int rc = alloc_common(&p, tm, D, rank, hid, ctx, eps, err);
	if (rc)
		return rc;
	if (!(p->off = calloc((size_t)p->L * D, sizeof *p->off))) {
		mcv_predictor_free(p);
		return mcv_error_set(err, MCV_ENOMEM, "out of memory for the predictor");
	}
	size_t total = 0;
	for (int l = 0; l < p->L; l++)
		for (int d = 1; d <= D; d++) {
			p->off[l * D + d - 1] = total;
			if (l + d < p->L)
				total += mcv_pred_map_size_at(p, l);
		}
	if (!(p->own = calloc(total ? total : 1, sizeof(float)))) {
		mcv_predictor_free(p);
		return mcv_error_set(err, MCV_ENOMEM, "out of memory for the predictor");
	}
	for (int l = 0; l < p->L; l++)
		for (int d = 1; d <= D && l + d < p->L; d++)
			map_bind(&p->maps[l * D + d - 1], p, p->own + p->off[l * D + d - 1], l);
	*out = p;
	return 0;
}

float *mcv_pred_map_params(mcv_predictor *p, int l, int d)
{
	return p->own + p->off[l * p->D + d - 1];
}

void mcv_predictor_free(mcv_predictor *p)
{
	if (!p)
		return;
	if (p->g)
		mcv_gguf_close(p->g);
	free(p->own);
	free(p->off);
	free(p->maps);
	free(p);
}

int mcv_predictor_max_lookahead(const mcv_predictor *p) { return p->D; }
const char *mcv_predictor_kind(const mcv_predictor *p)
{
	return p->kind == MCV_PRED_ROUTER ? "router" : "trained";
}
const mcv_trace_model *mcv_predictor_model(const mcv_predictor *p) { return &p->tm; }
int mcv_predictor_rank(const mcv_predictor *p) { return p->kind == MCV_PRED_ROUTER ? 0 : p->rank; }
int mcv_predictor_hidden(const mcv_predictor *p) { return p->hid; }
int mcv_predictor_context(const mcv_predictor *p) { return p->ctx; }

/* ---------------------------------------------------------------- file -- */

static int get_u32(const mcv_gguf *g, const char *key, uint32_t *v, mcv_error *err)
{
	int rc = mcv_gguf_get_u32(g, key, v, err);
	return rc ? mcv_error_prefix(err, "%s", key) : 0;
}

static int bind_tensor(const mcv_gguf *g, const char *name, int64_t ne0, int64_t ne1,
		       const float **out, mcv_error *err)
{
	const mcv_gguf_tensor *t = mcv_gguf_find_tensor(g, name);
	if (!t)
		return mcv_error_set(err, MCV_EFORMAT, "tensor %s is missing", name);
	const int want_dims = ne1 > 1 ? 2 : 1;
	if (t->type != MCV_F32 || t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != 1 || t->ne[3] != 1 ||
	    (t->n_dims != want_dims && !(t->n_dims == 2 && ne1 == 1)))
		return mcv_error_set(err, MCV_EFORMAT,
				     "tensor %s is %s [%" PRId64 ", %" PRId64 "], expected f32 [%" PRId64
				     ", %" PRId64 "]", name, t->type == MCV_F32 ? "f32" : "not f32",
				     t->ne[0], t->ne[1], ne0, ne1);
	*out = t->data;
	return 0;
}

int mcv_predictor_open(mcv_predictor **out, const char *path, mcv_error *err)
{
	*out = NULL;
	mcv_gguf *g;
	int rc = mcv_gguf_open(&g, path, err);
	if (rc)
		return rc;
	const char *s;
	mcv_error e2;
	if (mcv_gguf_get_str(g, "general.type", &s, &e2) || strcmp(s, MCV_PREDICTOR_TYPE)) {
		mcv_gguf_close(g);
		return mcv_error_set(err, MCV_EFORMAT, "%s: not an expert predictor (general.type is not %s)",
				     path, MCV_PREDICTOR_TYPE);
	}
	uint32_t ver, nl, ne, nu, D, rank, hid = 0;
	int64_t H;
	float eps;
	const char *arch, *fp, *kind;
	mcv_trace_model tm;
	memset(&tm, 0, sizeof tm);
	if ((rc = get_u32(g, "mcv.predictor.version", &ver, err)))
		goto fail;
	if (ver != MCV_PREDICTOR_VERSION && ver != MCV_PREDICTOR_VERSION_CTX) {
		rc = mcv_error_set(err, MCV_EUNSUPPORTED, "predictor version %u (this mcv reads %d and %d)",
				   ver, MCV_PREDICTOR_VERSION, MCV_PREDICTOR_VERSION_CTX);
		goto fail;
	}
	int ctx = 0;
	if (ver == MCV_PREDICTOR_VERSION_CTX) {
		const char *cs;
		if ((rc = mcv_gguf_get_str(g, "mcv.predictor.context", &cs, err)))
			goto fail;
		if (strcmp(cs, "routing")) {
			rc = mcv_error_set(err, MCV_EUNSUPPORTED,
					   "predictor context '%.64s' (this mcv reads routing)", cs);
			goto fail;
		}
		ctx = 1;
	}
	if ((rc = mcv_gguf_get_str(g, "mcv.predictor.kind", &kind, err)))
		goto fail;
	if (strcmp(kind, "lowrank")) {
		rc = mcv_error_set(err, MCV_EUNSUPPORTED, "predictor kind %s (this mcv reads lowrank)", kind);
		goto fail;
	}
	if ((rc = mcv_gguf_get_str(g, "mcv.predictor.model.architecture", &arch, err)) ||
	    (rc = get_u32(g, "mcv.predictor.model.n_layer", &nl, err)) ||
	    (rc = get_u32(g, "mcv.predictor.model.n_expert", &ne, err)) ||
	    (rc = get_u32(g, "mcv.predictor.model.n_expert_used", &nu, err)) ||
	    (rc = mcv_gguf_get_i64(g, "mcv.predictor.model.n_embd", &H, err)) ||
	    (rc = mcv_gguf_get_str(g, "mcv.predictor.model.fingerprint", &fp, err)) ||
	    (rc = get_u32(g, "mcv.predictor.lookahead", &D, err)) ||
	    (rc = get_u32(g, "mcv.predictor.rank", &rank, err)) ||
	    (rc = mcv_gguf_get_f32(g, "mcv.predictor.eps", &eps, err)))
		goto fail;
	if (mcv_gguf_find_key(g, "mcv.predictor.hidden") >= 0 &&
	    (rc = get_u32(g, "mcv.predictor.hidden", &hid, err)))
		goto fail;
	char *end;
	tm.fingerprint = strtoull(fp, &end, 16);
	if (strlen(fp) != 16 || *end) {
		rc = mcv_error_set(err, MCV_EFORMAT, "bad mcv.predictor.model.fingerprint '%s'", fp);
		goto fail;
	}
	snprintf(tm.arch, sizeof tm.arch, "%s", arch);
	tm.n_layer = (int)(nl > 1u << 20 ? 0 : nl);
	tm.n_expert = (int)(ne > 1u << 20 ? 0 : ne);
	tm.n_expert_used = (int)nu;
	tm.n_embd = H;
	if (nu < 1 || nu > ne || !(eps > 0.0f && eps < 1.0f)) {
		rc = mcv_error_set(err, MCV_EFORMAT, "bad predictor keys (top-%u of %u experts, eps %g)", nu,
				   ne, (double)eps);
		goto fail;
	}
	mcv_predictor *p;
	if ((rc = alloc_common(&p, &tm, (int)(D > 1u << 20 ? 0 : D), (int)(rank > 1u << 20 ? 0 : rank),
			       (int)(hid > 1u << 20 ? 1u << 20 : hid), ctx, eps, err)))
		goto fail;
	p->g = g;
	for (int l = 0; l < p->L; l++)
		for (int d = 1; d <= p->D && l + d < p->L; d++) {
			mcv_pred_map *mp = &p->maps[l * p->D + d - 1];
			char name[MCV_GGUF_MAX_NAME];
#define BIND(field, suffix, a, b) \
	snprintf(name, sizeof name, "pred.%d.%d." suffix, l, d); \
	if ((rc = bind_tensor(g, name, a, b, &mp->field, err))) { \
		mcv_predictor_free(p); \
		return mcv_error_prefix(err, "%s", path); \
	}
			BIND(norm, "norm", p->H, 1)
			BIND(down, "down", p->H, p->rank)
			BIND(up, "up", p->rank, p->E)
			BIND(bias, "bias", p->E, 1)
			if (p->hid > 0) {
				BIND(hdown, "hdown", p->H, p->hid)
				BIND(hbias, "hbias", p->hid, 1)
				BIND(hup, "hup", p->hid, p->E)
			}
			mp->S = mcv_pred_slots(p, l);
			if (mp->S > 0) {
				BIND(cout, "cout", p->E, (int64_t)mp->S * p->E)
				if (p->hid > 0) {
					BIND(chid, "chid", p->hid, (int64_t)mp->S * p->E)
				}
			}
#undef BIND
		}
	*out = p;
	return 0;
fail:
	mcv_gguf_close(g);
	return mcv_error_prefix(err, "%s", path);
}

int mcv_predictor_load(mcv_predictor **out, const char *path, const mcv_model *m, mcv_error *err)
{
	*out = NULL;
	mcv_trace_model tm;
	int rc = model_info(&tm, m, err);
	if (rc)
		return rc;
	mcv_predictor *p;
	if ((rc = mcv_predictor_open(&p, path, err)))
		return rc;
	if ((rc = mcv_trace_model_match(&p->tm, &tm, err))) {
		mcv_predictor_free(p);
		/* the matcher speaks of traces */
		const char *msg = strstr(err->msg, "(trace: ");
		char tail[sizeof err->msg];
		const char *src = msg ? msg + 8 : err->msg;
		size_t n = strnlen(src, sizeof tail - 1);
		memcpy(tail, src, n);
		tail[n] = 0;
		return mcv_error_set(err, MCV_EINVAL, "%s: predictor is for another model (predictor: %s",
				     path, tail);
	}
	*out = p;
	return 0;
}

int mcv_predictor_save(const mcv_predictor *p, const char *path, mcv_error *err)
{
	if (p->kind != MCV_PRED_TRAINED)
		return mcv_error_set(err, MCV_EINVAL, "only trained predictors are saved");
	mcv_gguf_writer *w;
	int rc = mcv_gguf_writer_open(&w, path, err);
	if (rc)
		return rc;
	char fp[32];
	snprintf(fp, sizeof fp, "%016" PRIx64, p->tm.fingerprint);
	mcv_gguf_w_str(w, "general.type", MCV_PREDICTOR_TYPE);
	/* a file without context stays version 1: older readers keep reading it */
	mcv_gguf_w_u32(w, "mcv.predictor.version",
		       p->ctx ? MCV_PREDICTOR_VERSION_CTX : MCV_PREDICTOR_VERSION);
	mcv_gguf_w_str(w, "mcv.predictor.kind", "lowrank");
	mcv_gguf_w_str(w, "mcv.predictor.model.architecture", p->tm.arch);
	mcv_gguf_w_u32(w, "mcv.predictor.model.n_layer", (uint32_t)p->L);
	mcv_gguf_w_u32(w, "mcv.predictor.model.n_expert", (uint32_t)p->E);
	mcv_gguf_w_u32(w, "mcv.predictor.model.n_expert_used", (uint32_t)p->tm.n_expert_used);
	mcv_gguf_w_u64(w, "mcv.predictor.model.n_embd", (uint64_t)p->H);
	mcv_gguf_w_str(w, "mcv.predictor.model.fingerprint", fp);
	mcv_gguf_w_u32(w, "mcv.predictor.lookahead", (uint32_t)p->D);
	mcv_gguf_w_u32(w, "mcv.predictor.rank", (uint32_t)p->rank);
	mcv_gguf_w_f32(w, "mcv.predictor.eps", p->eps);
	if (p->hid > 0)
		mcv_gguf_w_u32(w, "mcv.predictor.hidden", (uint32_t)p->hid);
	if (p->ctx)
		mcv_gguf_w_str(w, "mcv.predictor.context", "routing");
	for (int pass = 0; pass < 2; pass++) {
		for (int l = 0; l < p->L; l++)
			for (int d = 1; d <= p->D && l + d < p->L; d++) {
				const mcv_pred_map *mp = &p->maps[l * p->D + d - 1];
				const int64_t SE = (int64_t)mp->S * p->E;
				const struct { const char *s; const float *x; int64_t ne[2]; int nd; } t[9] = {
					{ "norm", mp->norm, { p->H, 1 }, 1 },
					{ "down", mp->down, { p->H, p->rank }, 2 },
					{ "up", mp->up, { p->rank, p->E }, 2 },
					{ "bias", mp->bias, { p->E, 1 }, 1 },
					{ "hdown", mp->hdown, { p->H, p->hid }, 2 },
					{ "hbias", mp->hbias, { p->hid, 1 }, 1 },
					{ "hup", mp->hup, { p->hid, p->E }, 2 },
					{ "cout", mp->cout, { p->E, SE }, 2 },
					{ "chid", mp->chid, { p->hid, SE }, 2 },
				};
				for (int i = 0; i < 9; i++) {
					if ((i >= 4 && i < 7 && p->hid == 0) || (i >= 7 && mp->S == 0) ||
					    (i == 8 && p->hid == 0))
						continue;
					char name[MCV_GGUF_MAX_NAME];
					snprintf(name, sizeof name, "pred.%d.%d.%s", l, d, t[i].s);
					if (pass == 0) {
						mcv_gguf_w_add_tensor(w, name, MCV_F32, t[i].nd, t[i].ne);
					} else {
						mcv_gguf_w_write(w, t[i].x,
								 sizeof(float) * (size_t)(t[i].ne[0] * t[i].ne[1]));
						mcv_gguf_w_end_tensor(w);
					}
				}
			}
		/* keys and infos are declared; data follows */
		if (pass == 0)
			mcv_gguf_w_begin_data(w);
	}
	return mcv_gguf_writer_finish(w, err);
}

/* ------------------------------------------------------------- scoring -- */

static void rms_scale(float *y, const float *x, const float *w, int n, float eps)
{
	double ss = 0.0;
	for (int i = 0; i < n; i++)
		ss += (double)x[i] * x[i];
	const float inv = (float)(1.0 / sqrt(ss / n + eps));
	for (int i = 0; i < n; i++)
		y[i] = x[i] * inv * w[i];
}

/* Eight partial sums in a fixed order: vectorisable without -ffast-math,
 * and the same result on every thread. */
float mcv_pred_dot(const float *a, const float *b, int n)
{
	float acc[8] = { 0 };
	int i = 0;
	for (; i + 8 <= n; i += 8)
		for (int j = 0; j < 8; j++)
			acc[j] += a[i + j] * b[i + j];
	float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
	for (; i < n; i++)
		s += a[i] * b[i];
	return s;
}

int mcv_pred_ctx_rows(const mcv_predictor *p, int l, const int32_t *prev, const int32_t *cur, int k,
		      int *rows)
{
	if (!p->ctx)
		return 0;
	const int L = p->L, E = p->E;
	int n = 0;
	for (int s = 0; s < L && prev; s++)
		for (int q = 0; q < k; q++) {
			const int32_t e = prev[(size_t)s * k + q];
			if (e >= 0 && e < E)
				rows[n++] = s * E + e;
		}
	for (int j = 0; j < l && cur; j++)
		for (int q = 0; q < k; q++) {
			const int32_t e = cur[(size_t)j * k + q];
			if (e >= 0 && e < E)
				rows[n++] = (L + j) * E + e;
		}
	return n;
}

void mcv_pred_map_apply(const mcv_pred_map *mp, int H, int r, int hid, int E, float eps,
			const float *h, const int *rows, int n, float *xn, float *z, float *scores)
{
	rms_scale(xn, h, mp->norm, H, eps);
	for (int j = 0; j < r; j++)
		z[j] = mcv_pred_dot(mp->down + (size_t)j * H, xn, H);
	float *a = z + r;
	for (int j = 0; j < hid; j++)
		a[j] = mp->hbias[j] + mcv_pred_dot(mp->hdown + (size_t)j * H, xn, H);
	/* context rows in their given order: the same sums in training,
	 * evaluation and the runtime */
	for (int i = 0; i < n && mp->S > 0 && hid > 0; i++) {
		const float *c = mp->chid + (size_t)rows[i] * hid;
		for (int j = 0; j < hid; j++)
			a[j] += c[j];
	}
	for (int j = 0; j < hid; j++)
		a[j] = a[j] > 0.0f ? a[j] : 0.0f;
	for (int e = 0; e < E; e++) {
		float s = mp->bias[e] + mcv_pred_dot(mp->up + (size_t)e * r, z, r);
		if (hid > 0)
			s += mcv_pred_dot(mp->hup + (size_t)e * hid, a, hid);
		scores[e] = s;
	}
	for (int i = 0; i < n && mp->S > 0; i++) {
		const float *c = mp->cout + (size_t)rows[i] * E;
		for (int e = 0; e < E; e++)
			scores[e] += c[e];
	}
}

int mcv_predictor_scores(const mcv_predictor *p, int l, int d, const float *h, float *scores,
			 mcv_error *err)
{
	return mcv_predictor_scores_ctx(p, l, d, h, NULL, scores, err);
}

int mcv_predictor_scores_ctx(const mcv_predictor *p, int l, int d, const float *h,
			     const mcv_pred_context *c, float *scores, mcv_error *err)
{
	if (l < 0 || d < 1 || d > p->D || l + d >= p->L)
		return mcv_error_set(err, MCV_EINVAL,
				     "no prediction for layer %d + %d (%d layers, lookahead up to %d)", l, d,
				     p->L, p->D);
	const int H = p->H, r = p->rank;
	/* per call scratch: concurrent callers share nothing */
	float stack[4096];
	int rstack[1024];
	const int k = p->tm.n_expert_used;
	const size_t nrows = p->ctx && c ? (size_t)(p->L + l) * (size_t)k : 0;
	const size_t need = (size_t)H + (size_t)r + (size_t)p->hid;
	float *xn = need <= sizeof stack / sizeof *stack ? stack : malloc(sizeof(float) * need);
	int *rows = nrows <= sizeof rstack / sizeof *rstack ? rstack : malloc(sizeof(int) * nrows);
	if (!xn || !rows) {
		if (xn != stack)
			free(xn);
		if (rows != rstack)
			free(rows);
		return mcv_error_set(err, MCV_ENOMEM, "out of memory");
	}
	if (p->kind == MCV_PRED_ROUTER) {
		const mcv_layer *L = &p->m->layers[l + d];
		rms_scale(xn, h, L->post_norm.data, H, p->eps);
		mcv_matvec(L->gate_inp.type, L->gate_inp.data, L->gate_inp.row_bytes, p->E, H, xn, scores);
	} else {
		const int n = nrows ? mcv_pred_ctx_rows(p, l, c->prev, c->cur, k, rows) : 0;
		mcv_pred_map_apply(&p->maps[l * p->D + d - 1], H, r, p->hid, p->E, p->eps, h, rows, n, xn,
				   xn + H, scores);
	}
	if (xn != stack)
		free(xn);
	if (rows != rstack)
		free(rows);
	return 0;
}

double mcv_pred_recall(const float *scores, int E, const int32_t *ids, int k)
{
	/* top-k by score, ties to the lower id: a bitmap of the picked */
	unsigned char picked[4096];
	unsigned char *pk = E <= (int)sizeof picked ? picked : calloc((size_t)E, 1);
	if (!pk)
		return 0.0;
	memset(pk, 0, (size_t)E);
	for (int s = 0; s < k && s < E; s++) {
		int best = -1;
		for (int e = 0; e < E; e++)
			if (!pk[e] && (best < 0 || scores[e] > scores[best]))
				best = e;
		if (best >= 0)
			pk[best] = 1;
	}
	int hit = 0;
	for (int i = 0; i < k; i++)
		hit += ids[i] >= 0 && ids[i] < E && pk[ids[i]];
	if (pk != picked)
		free(pk);
	return (double)hit / k;
}

/* ------------------------------------------------------------- session -- */

struct mcv_pred_session {
	const mcv_predictor *p;
	int L, k, E;
	int32_t *ring;    /* [2][L][k]: the last two rows routed at each layer */
	int *head;        /* [L]: ring index of the latest row */
	int *seen;        /* [L]: rows seen, capped at 2 */
	int32_t *prev, *cur; /* [L][k] scratch of a prediction */
	mcv_ctx *c;
	mcv_route_hook_fn chain;
	void *chain_user;
};

int mcv_pred_session_init(mcv_pred_session **out, const mcv_predictor *p, mcv_error *err)
{
	*out = NULL;
	mcv_pred_session *s = calloc(1, sizeof *s);
	if (!s)
		return mcv_error_set(err, MCV_ENOMEM, "out of memory");
	s->p = p;
	s->L = p->L;
	s->k = p->tm.n_expert_used;
	s->E = p->E;
	const size_t lk = (size_t)s->L * (size_t)s->k;
	s->ring = malloc(sizeof(int32_t) * 2 * lk);
	s->prev = malloc(sizeof(int32_t) * lk);
	s->cur = malloc(sizeof(int32_t) * lk);
	s->head = calloc((size_t)s->L, sizeof *s->head);
	s->seen = calloc((size_t)s->L, sizeof *s->seen);
	if (!s->ring || !s->prev || !s->cur || !s->head || !s->seen) {
		mcv_pred_session_free(s);
		return mcv_error_set(err, MCV_ENOMEM, "out of memory");
	}
	*out = s;
	return 0;
}

void mcv_pred_session_free(mcv_pred_session *s)
{
	if (!s)
		return;
	mcv_pred_session_detach(s);
	free(s->ring), free(s->prev), free(s->cur), free(s->head), free(s->seen);
	free(s);
}

void mcv_pred_session_route(void *user, int layer, int pos, const int32_t *ids, const float *w, int k)
{
	mcv_pred_session *s = user;
	if (layer >= 0 && layer < s->L && k == s->k) {
		const int h = s->seen[layer] ? 1 - s->head[layer] : 0;
		memcpy(s->ring + ((size_t)h * s->L + layer) * s->k, ids, sizeof(int32_t) * (size_t)k);
		s->head[layer] = h;
		if (s->seen[layer] < 2)
			s->seen[layer]++;
	}
	if (s->chain)
		s->chain(s->chain_user, layer, pos, ids, w, k);
}

void mcv_pred_session_attach(mcv_pred_session *s, mcv_ctx *c)
{
	mcv_pred_session_detach(s);
	s->c = c;
	s->chain = c->route_hook;
	s->chain_user = c->route_hook_user;
	mcv_ctx_set_route_hook(c, mcv_pred_session_route, s);
}

void mcv_pred_session_detach(mcv_pred_session *s)
{
	if (!s->c)
		return;
	if (s->c->route_hook == mcv_pred_session_route && s->c->route_hook_user == s)
		mcv_ctx_set_route_hook(s->c, s->chain, s->chain_user);
	s->c = NULL;
	s->chain = NULL;
	s->chain_user = NULL;
}

/* At the start of layer l the latest row of a layer below l is this
 * token's, of layer l and above the previous token's (whose layers below l
 * are then the row before the latest). */
int mcv_pred_session_predict(void *user, int l, int d, const float *h, float *scores)
{
	mcv_pred_session *s = user;
	mcv_error e;
	if (!s->p->ctx || l < 0 || l >= s->L)
		return mcv_predictor_scores(s->p, l, d, h, scores, &e);
	const size_t k = (size_t)s->k;
	int any_prev = 0;
	for (int j = 0; j < s->L; j++) {
		const int back = j < l; /* rows back from the latest */
		int32_t *dst = s->prev + (size_t)j * k;
		if (s->seen[j] > back) {
			const int slot = back ? 1 - s->head[j] : s->head[j];
			memcpy(dst, s->ring + ((size_t)slot * s->L + j) * k, sizeof(int32_t) * k);
			any_prev = 1;
		} else {
			for (size_t q = 0; q < k; q++)
				dst[q] = -1;
		}
		if (j < l) {
			int32_t *cd = s->cur + (size_t)j * k;
			if (s->seen[j] > 0)
				memcpy(cd, s->ring + ((size_t)s->head[j] * s->L + j) * k, sizeof(int32_t) * k);
			else
				for (size_t q = 0; q < k; q++)
					cd[q] = -1;
		}
	}
	const mcv_pred_context c = { any_prev ? s->prev : NULL, s->cur };
	return mcv_predictor_scores_ctx(s->p, l, d, h, &c, scores, &e);
}
