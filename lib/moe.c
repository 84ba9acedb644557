/* Feed-forward blocks: qwen35moe's routed experts + gated shared expert,
 * and qwen35's dense SwiGLU.
 *
 * Routing as llama.cpp: softmax over all experts, top-k by probability,
 * the k weights renormalised to sum 1.  Expert e of a stacked [H, F, E]
 * tensor is the row range [e*F, (e+1)*F) (a merged gate_up tensor holds
 * gate rows then up rows per expert).  The weighted expert outputs are
 * summed in top-k order, then the shared expert, scaled by
 * sigmoid(w_shexp . x), is added.  In a prefill the tokens are grouped by
 * expert so that each expert's weights are read once per batch.
 *
 * Experts are addressed by (layer, expert): the stacked tensors of a plain
 * file, the per-expert tensors of a packed one (through its layout), or,
 * with a memory budget, the expert cache of lib/les.c, which hands out
 * resident experts first and misses as their reads complete. */
#include "model_impl.h"
#include "pack.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

void mcv_swiglu(float *g, const float *u, size_t n)
{
	mcv_silu_vec(g, g, n);
#pragma omp simd
	for (size_t i = 0; i < n; i++)
		g[i] *= u[i];
}

void mcv_moe_route(const mcv_hparams *hp, float *p, int32_t *sel, float *w)
{
	const int E = hp->n_expert, k = hp->n_expert_used;
	float mx = -INFINITY;
	for (int e = 0; e < E; e++)
		if (p[e] > mx)
			mx = p[e];
	const float inv = (float)(1.0 / mcv_exp_shifted(p, p, E, mx));
	for (int e = 0; e < E; e++)
		p[e] *= inv;
	/* top-k, highest first; ties go to the lower index */
	unsigned char used[4096]; /* the loader bounds expert_count to 4096 */
	memset(used, 0, (size_t)E);
	for (int s = 0; s < k; s++) {
		int best = -1;
		for (int e = 0; e < E; e++)
			if (!used[e] && (best < 0 || p[e] > p[best]))
				best = e;
		used[best] = 1;
		sel[s] = best;
		w[s] = p[best];
	}
	/* ggml_sum_rows: the sum in double, rounded once */
	double wsum = 0.0;
	for (int s = 0; s < k; s++)
		wsum += (double)w[s];
	float ws = (float)wsum;
	if (ws < 6.103515625e-5f)
		ws = 6.103515625e-5f;
	for (int s = 0; s < k; s++)
		w[s] /= ws;
}

/* Where one expert's three matrices are: a bound stacked tensor and the
 * expert's first row in it (a plain file, resident), or 2-D views of the
 * expert alone (a packed file, or a slot of the expert cache).  The bytes,
 * and so the products, are the same either way. */
typedef struct expert_w {
	mcv_wt w[3];
	int64_t r0[3];
} expert_w;

static void expert_view(const mcv_model *m, int il, int e, const void *const p[3], expert_w *x)
{
	const mcv_expert_extent *xt = mcv_layout_expert(m->layout, il, e);
	for (int k = 0; k < 3; k++) {
		const mcv_expert_slice *s = &xt->s[k];
		mcv_wt *w = &x->w[k];
		memset(w, 0, sizeof *w);
		w->data = p[k];
		w->type = s->type;
		w->ne[0] = s->cols;
		w->ne[1] = s->rows;
		w->ne[2] = w->ne[3] = 1;
		w->row_bytes = (size_t)s->row_bytes;
		x->r0[k] = 0;
	}
}

static void expert_resident(const mcv_ctx *c, const mcv_layer *L, int e, expert_w *x)
{
	mcv_moe_expert_weights(c->m, L, e, x->w, x->r0);
}

void mcv_moe_expert_weights(const mcv_model *m, const mcv_layer *L, int e, mcv_wt w[3], int64_t r0[3])
{
	expert_w xw, *x = &xw;
	const int64_t F = m->hp.n_ff_exp, H = m->hp.n_embd;
	if (L->down_exps.data) {
		if (L->gate_up_exps.data) {
			x->w[0] = x->w[1] = L->gate_up_exps;
			x->r0[0] = (int64_t)e * 2 * F;
			x->r0[1] = (int64_t)e * 2 * F + F;
		} else {
			x->w[0] = L->gate_exps;
			x->w[1] = L->up_exps;
			x->r0[0] = x->r0[1] = (int64_t)e * F;
		}
		x->w[2] = L->down_exps;
		x->r0[2] = (int64_t)e * H;
	} else {
		const int il = (int)(L - m->layers);
		const void *p[3];
		for (int k = 0; k < 3; k++)
			p[k] = mcv_layout_slice_data(m->layout, il, e, k);
		expert_view(m, il, e, p, x);
	}
	for (int k = 0; k < 3; k++) {
		w[k] = x->w[k];
		r0[k] = x->r0[k];
	}
}

/* One expert over cnt gathered rows X: weighted results into their
 * (token, slot) rows of c->eo.  g, u hold cnt*F floats, d cnt*H. */
static void expert_apply(mcv_ctx *c, const expert_w *x, const float *X, int cnt,
			 const int32_t *toks, const int32_t *slots, float *g, float *u, float *d,
			 mcv_act *xa, mcv_act *ha)
{
	const mcv_hparams *hp = &c->m->hp;
	const int H = hp->n_embd, K = hp->n_expert_used, F = hp->n_ff_exp;
	mcv_wt_mm_expert(&x->w[0], x->r0[0], F, X, cnt, g, xa);
	mcv_wt_mm_expert(&x->w[1], x->r0[1], F, X, cnt, u, xa);
	mcv_swiglu(g, u, (size_t)cnt * F);
	if (ha)
		mcv_act_set(ha, g, F);
	mcv_wt_mm_expert(&x->w[2], x->r0[2], H, g, cnt, d, ha);
	for (int i = 0; i < cnt; i++) {
		const int t = toks[i], s = slots[i];
		const float w = c->selw[t * K + s];
		float *dst = c->eo + ((size_t)t * K + s) * H;
		const float *src = d + (size_t)i * H;
		for (int j = 0; j < H; j++)
			dst[j] = src[j] * w;
	}
}

/* Counting sort of the (token, slot) pairs by expert: expert e's pairs are
 * tok_list/slot_list[start[e] .. start[e+1]), tokens ascending.  ids[]
 * receives the experts used, ascending; returns their count.  Shared with
 * the one-region prefill (prefill.c). */
int mcv_moe_group_by_expert(mcv_ctx *c, int nt, int *start, int *fill, int *ids)
{
	const int E = c->m->hp.n_expert, K = c->m->hp.n_expert_used;
	memset(start, 0, sizeof *start * ((size_t)E + 1));
	for (int i = 0; i < nt * K; i++)
		start[c->sel[i] + 1]++;
	for (int e = 0; e < E; e++)
		start[e + 1] += start[e];
	memcpy(fill, start, sizeof *fill * (size_t)E);
	for (int t = 0; t < nt; t++)
		for (int s = 0; s < K; s++) {
			const int e = c->sel[t * K + s], i = fill[e]++;
			c->tok_list[i] = t;
			c->slot_list[i] = s;
		}
	int n = 0;
	for (int e = 0; e < E; e++)
		if (start[e + 1] > start[e])
			ids[n++] = e;
	return n;
}

/* Expert by expert, each product parallel over its rows: for a decode step
 * with fewer experts than threads. */
static void experts_serial(mcv_ctx *c, int nt, const int *start, const int *ids,
			   const expert_w *ws, int n, mcv_act *act)
{
	const int H = c->m->hp.n_embd;
	for (int q = 0; q < n; q++) {
		const int e = ids[q], cnt = start[e + 1] - start[e];
		const int32_t *toks = c->tok_list + start[e], *slots = c->slot_list + start[e];
		const float *X = c->xn;
		if (nt > 1) {
			for (int i = 0; i < cnt; i++)
				memcpy(c->xg + (size_t)i * H, c->xn + (size_t)toks[i] * H, sizeof(float) * H);
			X = c->xg;
		}
		/* act2 for the hidden row: c->act must keep holding xn */
		mcv_act *ha = cnt == 1 ? &c->act2 : NULL;
		expert_apply(c, &ws[q], X, cnt, toks, slots, c->big[0], c->big[1], c->big[2], act, ha);
	}
}

/* The experts are spread over the threads, each expert's products run on
 * one thread: one fork/join per layer instead of three per expert.  With
 * 256 experts and a few tokens each (prefill) or k small matrix-vector
 * products (decode), splitting every product over the threads costs more
 * in fork/join and barrier waits than the product.  Every output element
 * is computed by the same operations either way (mcv_matmul == mcv_matvec
 * bit for bit; F32 experts row by row), so the result does not depend on
 * the thread count.
 * Returns -1 when out of memory (the caller falls back to experts_serial). */
static int experts_parallel(mcv_ctx *c, int nt, const int *start, const int *ids,
			    const expert_w *ws, int n)
{
	const mcv_hparams *hp = &c->m->hp;
	const int H = hp->n_embd, F = hp->n_ff_exp;
	int nthr = omp_get_max_threads();
	/* per thread: gathered rows (H), gate (F), up (F), down (H) per token */
	const size_t per = (size_t)nt * (2 * (size_t)H + 2 * (size_t)F);
	float *scratch = malloc(sizeof(float) * per * (size_t)nthr);
	if (!scratch)
		return -1;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthr)
	for (int q = 0; q < n; q++) {
		const int e = ids[q], cnt = start[e + 1] - start[e];
		float *X = scratch + per * (size_t)omp_get_thread_num();
		float *g = X + (size_t)cnt * H, *u = g + (size_t)cnt * F, *d = u + (size_t)cnt * F;
		const int32_t *toks = c->tok_list + start[e], *slots = c->slot_list + start[e];
		for (int i = 0; i < cnt; i++)
			memcpy(X + (size_t)i * H, c->xn + (size_t)toks[i] * H, sizeof(float) * H);
		expert_apply(c, &ws[q], X, cnt, toks, slots, g, u, d, NULL, NULL);
	}
	free(scratch);
	return 0;
}

static void experts_run(mcv_ctx *c, int nt, const int *start, const int *ids,
			const expert_w *ws, int n, mcv_act *act)
{
	if ((nt == 1 && n < omp_get_max_threads()) || experts_parallel(c, nt, start, ids, ws, n) < 0)
		experts_serial(c, nt, start, ids, ws, n, act);
}

/* The routed experts of one layer.  Resident: all at once.  Budget mode:
 * the cache hands out the experts that are ready (resident ones first),
 * then the misses as their reads complete; each writes only its own
 * (token, slot) rows, so the order cannot change the sum. */
static void experts_forward(mcv_ctx *c, const mcv_layer *L, int nt, mcv_act *act)
{
	const int E = c->m->hp.n_expert, K = c->m->hp.n_expert_used;
	const int il = (int)(L - c->m->layers);
	int *start = malloc(sizeof(int) * (3 * (size_t)E + 1));
	expert_w *ws = malloc(sizeof *ws * (size_t)E);
	if (!start || !ws) {
		free(start);
		free(ws);
		if (!c->les_rc)
			c->les_rc = mcv_error_set(&c->les_err, MCV_ENOMEM, "out of memory");
		return;
	}
	int *fill = start + E + 1, *ids = fill + E;
	const int n = mcv_moe_group_by_expert(c, nt, start, fill, ids);
	if (!c->les) {
		for (int q = 0; q < n; q++)
			expert_resident(c, L, ids[q], &ws[q]);
		/* a decode step with fewer experts than threads splits the products */
		if ((nt == 1 && K < omp_get_max_threads()) ||
		    experts_parallel(c, nt, start, ids, ws, n) < 0)
			experts_serial(c, nt, start, ids, ws, n, act);
	} else {
		int *rdy = fill; /* free again after grouping */
		mcv_les_need(c->les, il, ids, n);
		int got;
		mcv_error err;
		while ((got = mcv_les_next(c->les, rdy, &err)) > 0) {
			for (int q = 0; q < got; q++) {
				const void *p[3];
				mcv_les_weights(c->les, il, rdy[q], p);
				expert_view(c->m, il, rdy[q], p, &ws[q]);
			}
			experts_run(c, nt, start, rdy, ws, got, act);
			mcv_les_release(c->les, rdy, got);
		}
		if (got < 0 && !c->les_rc) {
			c->les_err = err;
			c->les_rc = got;
		}
		mcv_les_layer_end(c->les, il);
	}
	free(start);
	free(ws);
}

void mcv_moe_forward(mcv_ctx *c, const mcv_layer *L, int nt)
{
	const mcv_hparams *hp = &c->m->hp;
	const int H = hp->n_embd, E = hp->n_expert, K = hp->n_expert_used;
	const int SF = hp->n_ff_shexp;
	mcv_act *act = nt == 1 ? &c->act : NULL;
	float *logits = c->small0;

	mcv_wt_mm(&L->gate_inp, 0, E, c->xn, nt, logits, act);
	for (int t = 0; t < nt; t++)
		mcv_moe_route(hp, logits + (size_t)t * E, c->sel + (size_t)t * K, c->selw + (size_t)t * K);
	if (c->route_override)
		for (int t = 0; t < nt; t++)
			c->route_override(c->route_override_user, (int)(L - c->m->layers), c->pos + t,
					  c->sel + (size_t)t * K, c->selw + (size_t)t * K, K);
	if (c->route_hook)
		for (int t = 0; t < nt; t++)
			c->route_hook(c->route_hook_user, (int)(L - c->m->layers), c->pos + t,
				      c->sel + (size_t)t * K, c->selw + (size_t)t * K, K);

	experts_forward(c, L, nt, act);
	for (int t = 0; t < nt; t++) {
		float *y = c->y + (size_t)t * H;
		const float *eo = c->eo + (size_t)t * K * H;
		memcpy(y, eo, sizeof(float) * H);
		for (int s = 1; s < K; s++)
			for (int j = 0; j < H; j++)
				y[j] += eo[(size_t)s * H + j];
	}

	/* shared expert */
	float *g = c->big[0], *u = c->big[1], *d = c->big[2], *sg = c->small1;
	mcv_wt_mm(&L->gate_shexp, 0, SF, c->xn, nt, g, act);
	mcv_wt_mm(&L->up_shexp, 0, SF, c->xn, nt, u, act);
	mcv_wt_mm(&L->gate_inp_shexp, 0, 1, c->xn, nt, sg, act);
	mcv_swiglu(g, u, (size_t)nt * SF);
	if (act)
		mcv_act_set(act, g, SF);
	mcv_wt_mm(&L->down_shexp, 0, H, g, nt, d, act);
	for (int t = 0; t < nt; t++) {
		const float gate = mcv_sigmoid(sg[t]);
		float *y = c->y + (size_t)t * H;
		const float *dd = d + (size_t)t * H;
		for (int j = 0; j < H; j++)
			y[j] += dd[j] * gate;
	}
}

void mcv_ffn_forward(mcv_ctx *c, const mcv_layer *L, int nt)
{
	const mcv_hparams *hp = &c->m->hp;
	const int H = hp->n_embd, FF = hp->n_ff;
	mcv_act *act = nt == 1 ? &c->act : NULL;
	float *g = c->big[0], *u = c->big[1];
	mcv_wt_mm(&L->ffn_gate, 0, FF, c->xn, nt, g, act);
	mcv_wt_mm(&L->ffn_up, 0, FF, c->xn, nt, u, act);
	mcv_swiglu(g, u, (size_t)nt * FF);
	if (act)
		mcv_act_set(act, g, FF);
	mcv_wt_mm(&L->ffn_down, 0, H, g, nt, c->y, act);
}
