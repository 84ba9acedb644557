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

void mcv_moe_forward(mcv_ctx *c, const mcv_layer *L, int nt)
{
	const mcv_hparams *hp = &c->m->hp;
	const int H = hp->n_embd, E = hp->n_expert, K = hp->n_expert_used;
	const int F = hp->n_ff_exp, SF = hp->n_ff_shexp;
	mcv_act *act = nt == 1 ? &c->act : NULL;
	float *logits = c->small0;

	mcv_wt_mm(&L->gate_inp, 0, E, c->xn, nt, logits, act);
	for (int t = 0; t < nt; t++)
		route(hp, logits + (size_t)t * E, c->sel + (size_t)t * K, c->selw + (size_t)t * K);

	/* Each expert once, over the tokens that chose it. */
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
		mcv_act *xa = act;
		if (nt > 1) {
			for (int i = 0; i < cnt; i++)
				memcpy(c->xg + (size_t)i * H, c->xn + (size_t)c->tok_list[i] * H,
				       sizeof(float) * H);
			X = c->xg;
		}
		float *g = c->big[0], *u = c->big[1], *d = c->big[2];
		if (L->gate_up_exps.data) {
			mcv_wt_mm(&L->gate_up_exps, (int64_t)e * 2 * F, F, X, cnt, g, xa);
			mcv_wt_mm(&L->gate_up_exps, (int64_t)e * 2 * F + F, F, X, cnt, u, xa);
		} else {
			mcv_wt_mm(&L->gate_exps, (int64_t)e * F, F, X, cnt, g, xa);
			mcv_wt_mm(&L->up_exps, (int64_t)e * F, F, X, cnt, u, xa);
		}
		swiglu(g, u, (size_t)cnt * F);
		mcv_act *ha = NULL;
		if (cnt == 1) { /* act2: c->act must keep holding xn */
			ha = &c->act2;
			mcv_act_set(ha, g, F);
		}
		mcv_wt_mm(&L->down_exps, (int64_t)e * H, H, g, cnt, d, ha);
		for (int i = 0; i < cnt; i++) {
			const int t = c->tok_list[i], s = c->slot_list[i];
			const float w = c->selw[t * K + s];
			float *dst = c->eo + ((size_t)t * K + s) * H;
			const float *src = d + (size_t)i * H;
			for (int j = 0; j < H; j++)
				dst[j] = src[j] * w;
		}
	}
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
