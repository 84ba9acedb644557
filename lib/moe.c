/* Feed-forward blocks: qwen35moe's routed experts + gated shared expert,
 * and qwen35's dense SwiGLU.
 *
 * Routing as llama.cpp: softmax over all experts, top-k by probability,
 * the k weights renormalised to sum 1.  Expert e of a stacked [H, F, E]
 * tensor is the row range [e*F, (e+1)*F) (a merged gate_up tensor holds
 * gate rows then up rows per expert).  The weighted expert outputs are
 * summed in top-k order, then the shared expert, scaled by
 * sigmoid(w_shexp . x), is added.  In a prefill the tokens are grouped by
 * expert so that each expert's weights are read once per batch. */
#include "model_impl.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

static void swiglu(float *g, const float *u, size_t n)
{
	for (size_t i = 0; i < n; i++)
		g[i] = mcv_silu(g[i]) * u[i];
}

static void route(const mcv_hparams *hp, float *p, int32_t *sel, float *w)
{
	const int E = hp->n_expert, k = hp->n_expert_used;
	float mx = -INFINITY;
	for (int e = 0; e < E; e++)
		if (p[e] > mx)
			mx = p[e];
	double sum = 0.0;
	for (int e = 0; e < E; e++) {
		p[e] = expf(p[e] - mx);
		sum += p[e];
	}
	const float inv = (float)(1.0 / sum);
	for (int e = 0; e < E; e++)
		p[e] *= inv;
	/* top-k, highest first; ties go to the lower index */
	for (int s = 0; s < k; s++) {
		int best = -1;
		for (int e = 0; e < E; e++) {
			int used = 0;
			for (int r = 0; r < s; r++)
				if (sel[r] == e)
					used = 1;
			if (!used && (best < 0 || p[e] > p[best]))
				best = e;
		}
		sel[s] = best;
		w[s] = p[best];
	}
	float ws = 0.0f;
	for (int s = 0; s < k; s++)
		ws += w[s];
	if (ws < 6.103515625e-5f)
		ws = 6.103515625e-5f;
	for (int s = 0; s < k; s++)
		w[s] /= ws;
}

/* One expert over cnt gathered rows X: weighted results into their
 * (token, slot) rows of c->eo.  g, u hold cnt*F floats, d cnt*H. */
static void expert_apply(mcv_ctx *c, const mcv_layer *L, int e, const float *X, int cnt,
			 const int32_t *toks, const int32_t *slots, float *g, float *u, float *d,
			 mcv_act *xa, mcv_act *ha)
{
	const mcv_hparams *hp = &c->m->hp;
	const int H = hp->n_embd, K = hp->n_expert_used, F = hp->n_ff_exp;
	if (L->gate_up_exps.data) {
		mcv_wt_mm(&L->gate_up_exps, (int64_t)e * 2 * F, F, X, cnt, g, xa);
		mcv_wt_mm(&L->gate_up_exps, (int64_t)e * 2 * F + F, F, X, cnt, u, xa);
	} else {
		mcv_wt_mm(&L->gate_exps, (int64_t)e * F, F, X, cnt, g, xa);
		mcv_wt_mm(&L->up_exps, (int64_t)e * F, F, X, cnt, u, xa);
	}
	swiglu(g, u, (size_t)cnt * F);
	if (ha)
		mcv_act_set(ha, g, F);
	mcv_wt_mm(&L->down_exps, (int64_t)e * H, H, g, cnt, d, ha);
	for (int i = 0; i < cnt; i++) {
		const int t = toks[i], s = slots[i];
		const float w = c->selw[t * K + s];
		float *dst = c->eo + ((size_t)t * K + s) * H;
		const float *src = d + (size_t)i * H;
		for (int j = 0; j < H; j++)
			dst[j] = src[j] * w;
	}
}

/* Expert by expert, each product parallel over its rows: for a decode step
 * with fewer experts than threads. */
static void experts_serial(mcv_ctx *c, const mcv_layer *L, int nt, mcv_act *act)
{
	const mcv_hparams *hp = &c->m->hp;
	const int H = hp->n_embd, E = hp->n_expert, K = hp->n_expert_used;
	for (int e = 0; e < E; e++) {
		int cnt = 0;
		for (int t = 0; t < nt; t++)
			for (int s = 0; s < K; s++)
				if (c->sel[t * K + s] == e) {
					c->tok_list[cnt] = t;
					c->slot_list[cnt] = s;
					cnt++;
				}
		if (!cnt)
			continue;
		const float *X = c->xn;
		if (nt > 1) {
			for (int i = 0; i < cnt; i++)
				memcpy(c->xg + (size_t)i * H, c->xn + (size_t)c->tok_list[i] * H,
				       sizeof(float) * H);
			X = c->xg;
		}
		/* act2 for the hidden row: c->act must keep holding xn */
		mcv_act *ha = cnt == 1 ? &c->act2 : NULL;
		expert_apply(c, L, e, X, cnt, c->tok_list, c->slot_list, c->big[0], c->big[1], c->big[2],
			     act, ha);
	}
}

/* The experts a batch uses are spread over the threads, each expert's
 * products run on one thread: one fork/join per layer instead of three per
 * expert.  With 256 experts and a few tokens each (prefill) or k small
 * matrix-vector products (decode), splitting every product over the
 * threads costs more in fork/join and barrier waits than the product.  Every output element is computed by
 * the same operations either way (mcv_matmul == mcv_matvec bit for bit), so
 * the result does not depend on the thread count.  Returns -1 when out of
 * memory (the caller falls back to experts_serial). */
static int experts_parallel(mcv_ctx *c, const mcv_layer *L, int nt)
{
	const mcv_hparams *hp = &c->m->hp;
	const int H = hp->n_embd, E = hp->n_expert, K = hp->n_expert_used, F = hp->n_ff_exp;
	int *start = calloc((size_t)E + 1, sizeof *start);
	if (!start)
		return -1;
	/* counting sort of the (token, slot) pairs by expert */
	for (int i = 0; i < nt * K; i++)
		start[c->sel[i] + 1]++;
	for (int e = 0; e < E; e++)
		start[e + 1] += start[e];
	int *fill = malloc(sizeof *fill * (size_t)E);
	if (!fill) {
		free(start);
		return -1;
	}
	memcpy(fill, start, sizeof *fill * (size_t)E);
	for (int t = 0; t < nt; t++)
		for (int s = 0; s < K; s++) {
			const int e = c->sel[t * K + s], i = fill[e]++;
			c->tok_list[i] = t;
			c->slot_list[i] = s;
		}
	free(fill);
	int nthr = omp_get_max_threads();
	/* per thread: gathered rows (H), gate (F), up (F), down (H) per token */
	const size_t per = (size_t)nt * (2 * (size_t)H + 2 * (size_t)F);
	float *scratch = malloc(sizeof(float) * per * (size_t)nthr);
	if (!scratch) {
		free(start);
		return -1;
	}
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthr)
	for (int e = 0; e < E; e++) {
		const int cnt = start[e + 1] - start[e];
		if (!cnt)
			continue;
		float *X = scratch + per * (size_t)omp_get_thread_num();
		float *g = X + (size_t)cnt * H, *u = g + (size_t)cnt * F, *d = u + (size_t)cnt * F;
		const int32_t *toks = c->tok_list + start[e], *slots = c->slot_list + start[e];
		for (int i = 0; i < cnt; i++)
			memcpy(X + (size_t)i * H, c->xn + (size_t)toks[i] * H, sizeof(float) * H);
		expert_apply(c, L, e, X, cnt, toks, slots, g, u, d, NULL, NULL);
	}
	free(scratch);
	free(start);
	return 0;
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
		route(hp, logits + (size_t)t * E, c->sel + (size_t)t * K, c->selw + (size_t)t * K);

	if ((nt == 1 && K < omp_get_max_threads()) || experts_parallel(c, L, nt) < 0)
		experts_serial(c, L, nt, act);
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
	swiglu(g, u, (size_t)nt * SF);
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
	swiglu(g, u, (size_t)nt * FF);
	if (act)
		mcv_act_set(act, g, FF);
	mcv_wt_mm(&L->ffn_down, 0, H, g, nt, c->y, act);
}
