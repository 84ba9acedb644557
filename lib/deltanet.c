/* Gated DeltaNet layer (linear attention) of qwen35.
 *
 * Per token: qkv = W_qkv x goes through a causal depthwise conv (kernel K,
 * the last K-1 inputs kept across calls, each output's taps fused
 * multiply-adds in tap order as ggml's ssm_conv) and SiLU, then splits into q, k
 * (nk heads of dk) and v (nv heads of dv).  q and k are L2-normalised.
 * Value head hv reads key head hv % nk (llama.cpp tiles the key heads over
 * the value heads).  With beta = sigmoid(W_beta x) and
 * g = softplus(W_alpha x + dt_bias) * a, each head's state S (dv x dk) is
 *     S *= exp(g);  d = (v - S k) * beta;  S += d k^T;  o = S q / sqrt(dk)
 * and the output is RMSNorm(o) * w * silu(z) per head, z = W_gate x, then
 * W_out.  Prefill runs the same recurrence token by token, so prefill and
 * decode give the same numbers.  The steps are functions over a range
 * (channels, rows, heads) so that lib/prefill.c can share them out among
 * the threads of its one parallel region with the same arithmetic. */
#include "model_impl.h"

#include <math.h>
#include <string.h>

/* One row j of a head's state: S_j *= decay; d = (v_j - S_j.k) * beta;
 * S_j += d k; returns S_j.q.  Rounded as llama.cpp's CPU op does it: the
 * two dots are ggml's F32 vec_dot (mcv_vec_dot: with AVX-512, lanes over
 * 64-element steps and the rest one float at a time, so a head of 32 sums
 * in index order), the update a fused multiply-add per element. */
float mcv_delta_row(float *S, const float *k, const float *q, float decay, float v, float b, int dk)
{
	for (int i = 0; i < dk; i++)
		S[i] *= decay;
	const float sk = mcv_vec_dot(MCV_F32, dk, S, k);
	const float d = (v - sk) * b;
	for (int i = 0; i < dk; i++)
		S[i] = fmaf(k[i], d, S[i]);
	return mcv_vec_dot(MCV_F32, dk, S, q);
}

/* Causal depthwise conv + SiLU of channels [ch0, ch1); the window is the
 * K-1 saved inputs followed by this call's nt inputs of qkv. */
void mcv_deltanet_conv(mcv_ctx *c, const mcv_layer *L, int nt, const float *qkv, float *cv, int ch0, int ch1)
{
	const mcv_hparams *hp = &c->m->hp;
	const int C = hp->ssm_conv_ch, K = hp->ssm_k;
	const float *cw = L->ssm_conv.data;
	float *cst = c->conv_state + (size_t)L->rs_index * (K - 1) * C;
	/* Row by row, channels innermost (unit stride: vectorised), in blocks
	 * of 64 channels with the weights transposed to tap-major; each output
	 * still adds its K taps in order from 0. */
	enum { CB = 64 };
	float wt[16][CB];
	for (int c0 = ch0; c0 < ch1; c0 += CB) {
		const int nc = ch1 - c0 < CB ? ch1 - c0 : CB;
		for (int i = 0; i < K && i < 16; i++)
			for (int j = 0; j < nc; j++)
				wt[i][j] = cw[(size_t)(c0 + j) * K + i];
		for (int t = 0; t < nt; t++) {
			float *o = cv + (size_t)t * C + c0;
			for (int j = 0; j < nc; j++)
				o[j] = 0.0f;
			for (int i = 0; i < K; i++) {
				const int r = t + i; /* window row */
				const float *x = r < K - 1 ? cst + (size_t)r * C + c0 : qkv + (size_t)(r - (K - 1)) * C + c0;
				const float *w = K <= 16 ? wt[i] : NULL;
				if (w) {
#pragma omp simd
					for (int j = 0; j < nc; j++)
						o[j] = fmaf(x[j], w[j], o[j]);
				} else {
					for (int j = 0; j < nc; j++)
						o[j] = fmaf(x[j], cw[(size_t)(c0 + j) * K + i], o[j]);
				}
			}
		}
		/* new state: window rows nt .. nt+K-2 (in place: row r reads row
		 * r + nt >= r, so ascending r never reads an overwritten row) */
		for (int r = 0; r < K - 1; r++) {
			const int wr = nt + r;
			const float *x = wr < K - 1 ? cst + (size_t)wr * C + c0 : qkv + (size_t)(wr - (K - 1)) * C + c0;
			memmove(cst + (size_t)r * C + c0, x, sizeof(float) * (size_t)nc);
		}
	}
	for (int t = 0; t < nt && ch1 > ch0; t++)
		mcv_silu_vec(cv + (size_t)t * C + ch0, cv + (size_t)t * C + ch0, (size_t)(ch1 - ch0));
}

/* Rows [t0, t1): L2-normalise the q and k heads in place; turn beta/alpha
 * into the per-head beta and log-decay g. */
void mcv_deltanet_gates(mcv_ctx *c, const mcv_layer *L, float *cv, float *beta, float *alpha, int t0, int t1)
{
	const mcv_hparams *hp = &c->m->hp;
	const int C = hp->ssm_conv_ch, nk = hp->ssm_nk, nv = hp->ssm_nv, dk = hp->ssm_dk, Dk = hp->ssm_dkey;
	const float *dt = L->ssm_dt.data, *a = L->ssm_a.data;
	for (int t = t0; t < t1; t++) {
		float *row = cv + (size_t)t * C;
		for (int h = 0; h < nk; h++) {
			mcv_l2_norm(row + (size_t)h * dk, row + (size_t)h * dk, dk, hp->eps);
			mcv_l2_norm(row + Dk + (size_t)h * dk, row + Dk + (size_t)h * dk, dk, hp->eps);
		}
		for (int h = 0; h < nv; h++) {
			beta[(size_t)t * nv + h] = mcv_sigmoid(beta[(size_t)t * nv + h]);
			alpha[(size_t)t * nv + h] = mcv_softplus(alpha[(size_t)t * nv + h] + dt[h]) * a[h];
		}
	}
}

/* The recurrence of value heads [h0, h1) over the nt rows, then the gated
 * RMSNorm with silu(z); rows of S are value dims, each row contiguous over
 * key dims. */
void mcv_deltanet_scan(mcv_ctx *c, const mcv_layer *L, int nt, const float *cv, const float *beta,
		       const float *alpha, const float *z, float *o, int h0, int h1)
{
	const mcv_hparams *hp = &c->m->hp;
	const int C = hp->ssm_conv_ch, nk = hp->ssm_nk, nv = hp->ssm_nv, dk = hp->ssm_dk, dv = hp->ssm_dv;
	const int Dk = hp->ssm_dkey, Dv = hp->ssm_dval;
	const float scale = 1.0f / sqrtf((float)dk);
	float *S_all = c->ssm_state + (size_t)L->rs_index * nv * dv * dk;
	const float *nw = L->ssm_norm.data;
	for (int hv = h0; hv < h1; hv++) {
		float *S = S_all + (size_t)hv * dv * dk;
		const int hk = hv % nk;
		for (int t = 0; t < nt; t++) {
			const float *row = cv + (size_t)t * C;
			const float *q = row + (size_t)hk * dk;
			const float *k = row + Dk + (size_t)hk * dk;
			const float *v = row + 2 * Dk + (size_t)hv * dv;
			const float b = beta[(size_t)t * nv + hv];
			const float decay = expf(alpha[(size_t)t * nv + hv]);
			float *out = o + (size_t)t * Dv + (size_t)hv * dv;
			for (int j = 0; j < dv; j++)
				out[j] = mcv_delta_row(S + (size_t)j * dk, k, q, decay, v[j], b, dk) * scale;
			/* gated RMSNorm with silu(z) */
			const float *zz = z + (size_t)t * Dv + (size_t)hv * dv;
			mcv_rms_norm(out, out, nw, dv, hp->eps);
			float sz[256];
			for (int j0 = 0; j0 < dv; j0 += 256) {
				const int nj = dv - j0 < 256 ? dv - j0 : 256;
				mcv_silu_vec(sz, zz + j0, (size_t)nj);
				for (int j = 0; j < nj; j++)
					out[j0 + j] *= sz[j];
			}
		}
	}
}

void mcv_deltanet_forward(mcv_ctx *c, const mcv_layer *L, int nt)
{
	const mcv_hparams *hp = &c->m->hp;
	const int H = hp->n_embd, C = hp->ssm_conv_ch;
	const int nv = hp->ssm_nv, Dv = hp->ssm_dval;
	float *qkv = c->big[0], *z = c->big[1], *cv = c->big[2], *o = c->big[3];
	float *beta = c->small0, *alpha = c->small1;
	mcv_act *act = nt == 1 ? &c->act : NULL;

	mcv_wt_mm(&L->ssm_qkv, 0, C, c->xn, nt, qkv, act);
	mcv_wt_mm(&L->ssm_gate, 0, Dv, c->xn, nt, z, act);
	mcv_wt_mm(&L->ssm_beta, 0, nv, c->xn, nt, beta, act);
	mcv_wt_mm(&L->ssm_alpha, 0, nv, c->xn, nt, alpha, act);

	/* one thread unless the work pays for the fork */
	const int par = nt * C >= 8192;
#pragma omp parallel for schedule(static) if (par)
	for (int ch = 0; ch < C; ch += 64)
		mcv_deltanet_conv(c, L, nt, qkv, cv, ch, ch + 64 < C ? ch + 64 : C);
#pragma omp parallel for schedule(static) if (par)
	for (int t = 0; t < nt; t++)
		mcv_deltanet_gates(c, L, cv, beta, alpha, t, t + 1);
#pragma omp parallel for schedule(static) if (par)
	for (int hv = 0; hv < nv; hv++)
		mcv_deltanet_scan(c, L, nt, cv, beta, alpha, z, o, hv, hv + 1);

	if (act)
		mcv_act_set(act, o, Dv);
	mcv_wt_mm(&L->ssm_out, 0, H, o, nt, c->y, act);
}
