/* Gated DeltaNet layer (linear attention) of qwen35.
 *
 * Per token: qkv = W_qkv x goes through a causal depthwise conv (kernel K,
 * the last K-1 inputs kept across calls) and SiLU, then splits into q, k
 * (nk heads of dk) and v (nv heads of dv).  q and k are L2-normalised.
 * Value head hv reads key head hv % nk (llama.cpp tiles the key heads over
 * the value heads).  With beta = sigmoid(W_beta x) and
 * g = softplus(W_alpha x + dt_bias) * a, each head's state S (dv x dk) is
 *     S *= exp(g);  d = (v - S k) * beta;  S += d k^T;  o = S q / sqrt(dk)
 * and the output is RMSNorm(o) * w * silu(z) per head, z = W_gate x, then
 * W_out.  Prefill runs the same recurrence token by token, so prefill and
 * decode give the same numbers. */
#include "model_impl.h"

#include <math.h>
#include <string.h>

static inline float dot(const float *a, const float *b, int n)
{
	float s = 0.0f;
	for (int i = 0; i < n; i++)
		s += a[i] * b[i];
	return s;
}

void mcv_deltanet_forward(mcv_ctx *c, const mcv_layer *L, int nt)
{
	const mcv_hparams *hp = &c->m->hp;
	const int H = hp->n_embd, C = hp->ssm_conv_ch, K = hp->ssm_k;
	const int nk = hp->ssm_nk, nv = hp->ssm_nv, dk = hp->ssm_dk, dv = hp->ssm_dv;
	const int Dk = hp->ssm_dkey, Dv = hp->ssm_dval;
	float *qkv = c->big[0], *z = c->big[1], *cv = c->big[2], *o = c->big[3];
	float *beta = c->small0, *alpha = c->small1;
	mcv_act *act = nt == 1 ? &c->act : NULL;

	mcv_wt_mm(&L->ssm_qkv, 0, C, c->xn, nt, qkv, act);
	mcv_wt_mm(&L->ssm_gate, 0, Dv, c->xn, nt, z, act);
	mcv_wt_mm(&L->ssm_beta, 0, nv, c->xn, nt, beta, act);
	mcv_wt_mm(&L->ssm_alpha, 0, nv, c->xn, nt, alpha, act);

	/* Causal depthwise conv + SiLU, channel by channel; the window is the
	 * K-1 saved inputs followed by this call's nt inputs. */
	const float *cw = L->ssm_conv.data;
	float *cst = c->conv_state + (size_t)L->rs_index * (K - 1) * C;
#pragma omp parallel for schedule(static)
	for (int ch = 0; ch < C; ch++) {
		const float *w = cw + (size_t)ch * K;
		float keep[64];
		for (int t = 0; t < nt; t++) {
			float s = 0.0f;
			for (int i = 0; i < K; i++) {
				const int r = t + i; /* window row */
				const float xin = r < K - 1 ? cst[(size_t)r * C + ch]
							   : qkv[(size_t)(r - (K - 1)) * C + ch];
				s += xin * w[i];
			}
			cv[(size_t)t * C + ch] = mcv_silu(s);
		}
		/* new state: window rows nt .. nt+K-2 */
		for (int r = 0; r < K - 1; r++) {
			const int wr = nt + r;
			keep[r] = wr < K - 1 ? cst[(size_t)wr * C + ch]
					     : qkv[(size_t)(wr - (K - 1)) * C + ch];
		}
		for (int r = 0; r < K - 1; r++)
			cst[(size_t)r * C + ch] = keep[r];
	}

	/* L2-normalise q and k heads in place; turn beta/alpha into the
	 * per-head beta and log-decay g. */
	const float *dt = L->ssm_dt.data, *a = L->ssm_a.data;
#pragma omp parallel for schedule(static)
	for (int t = 0; t < nt; t++) {
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

	/* The recurrence, one value head per task; rows of S are value dims,
	 * each row contiguous over key dims. */
	const float scale = 1.0f / sqrtf((float)dk);
	float *S_all = c->ssm_state + (size_t)L->rs_index * nv * dv * dk;
	const float *nw = L->ssm_norm.data;
#pragma omp parallel for schedule(static)
	for (int hv = 0; hv < nv; hv++) {
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
			for (int j = 0; j < dv; j++) {
				float *Sj = S + (size_t)j * dk;
				for (int i = 0; i < dk; i++)
					Sj[i] *= decay;
				const float d = (v[j] - dot(Sj, k, dk)) * b;
				for (int i = 0; i < dk; i++)
					Sj[i] += k[i] * d;
				out[j] = dot(Sj, q, dk) * scale;
			}
			/* gated RMSNorm with silu(z) */
			const float *zz = z + (size_t)t * Dv + (size_t)hv * dv;
			mcv_rms_norm(out, out, nw, dv, hp->eps);
			for (int j = 0; j < dv; j++)
				out[j] *= mcv_silu(zz[j]);
		}
	}

	if (act)
		mcv_act_set(act, o, Dv);
	mcv_wt_mm(&L->ssm_out, 0, H, o, nt, c->y, act);
}
