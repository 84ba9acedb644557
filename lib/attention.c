/* Full (gated) attention layer of qwen35: one projection gives per head the
 * query and an output gate; Q and K are RMS-normed per head, rotated with
 * interleaved M-RoPE on the first n_rot dims, and attend causally over an
 * fp16 KV cache with GQA (query head h reads KV head h / (n_head/n_head_kv)).
 *
 * Rounding follows llama.cpp's CPU path without flash attention: K and V
 * are stored as fp16, the query is rounded to fp16 for the QK dot, and the
 * softmax weights are rounded to fp16 before they weight V.  The steps
 * are functions over rows / (row, head) pairs, shared with lib/prefill.c. */
#include "model_impl.h"

#include <math.h>
#include <omp.h>
#include <string.h>
#if defined(__F16C__) && defined(__AVX2__)
#include <immintrin.h>
#define HAVE_F16C 1
#endif

static inline float f16r(float x) { return mcv_fp16_to_fp32(mcv_fp32_to_fp16(x)); }

static void store_f16(uint16_t *dst, const float *src, int n)
{
	int i = 0;
#ifdef HAVE_F16C
	for (; i + 8 <= n; i += 8)
		_mm_storeu_si128((__m128i *)(dst + i),
				 _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
	for (; i < n; i++)
		dst[i] = mcv_fp32_to_fp16(src[i]);
}

static float dot_f16(const uint16_t *k, const float *q, int n)
{
	int i = 0;
	float s = 0.0f;
#ifdef HAVE_F16C
	__m256 acc = _mm256_setzero_ps();
	for (; i + 8 <= n; i += 8)
		acc = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + i))),
				      _mm256_loadu_ps(q + i), acc);
	__m128 h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
	h = _mm_add_ps(h, _mm_movehl_ps(h, h));
	h = _mm_add_ss(h, _mm_movehdup_ps(h));
	s = _mm_cvtss_f32(h);
#endif
	for (; i < n; i++)
		s += mcv_fp16_to_fp32(k[i]) * q[i];
	return s;
}

static void axpy_f16(float *o, const uint16_t *v, float p, int n)
{
	int i = 0;
#ifdef HAVE_F16C
	const __m256 pp = _mm256_set1_ps(p);
	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(o + i, _mm256_fmadd_ps(
			_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + i))), pp,
			_mm256_loadu_ps(o + i)));
#endif
	for (; i < n; i++)
		o[i] += mcv_fp16_to_fp32(v[i]) * p;
}

/* Rows [t0, t1): norm and rotate Q (in place, its gate half untouched)
 * and K, and store K/V in the cache at slot0 + t. */
void mcv_attn_prep(mcv_ctx *c, const mcv_layer *L, int slot0, float *Q, float *K, const float *V,
		   int t0, int t1)
{
	const mcv_hparams *hp = &c->m->hp;
	const int hd = hp->head_dim, nh = hp->n_head, nkv = hp->n_head_kv;
	const int nq = 2 * hd * nh, nk = hd * nkv;
	const float *qw = L->q_norm.data, *kw = L->k_norm.data;
	const size_t kv_layer = (size_t)L->kv_index * c->n_ctx * nk;
	uint16_t *kc = c->kcache + kv_layer, *vc = c->vcache + kv_layer;
	for (int t = t0; t < t1; t++) {
		float cosin[hp->n_rot]; /* n_rot <= head_dim <= 16384 */
		mcv_rope_cache(cosin, hp->n_rot, c->pos4 + 4 * t, hp->rope_sections, hp->rope_base);
		for (int h = 0; h < nh; h++) {
			float *q = Q + (size_t)t * nq + (size_t)h * 2 * hd;
			mcv_rms_norm(q, q, qw, hd, hp->eps);
			mcv_rope_apply(q, hp->n_rot, cosin);
		}
		for (int h = 0; h < nkv; h++) {
			float *k = K + (size_t)t * nk + (size_t)h * hd;
			mcv_rms_norm(k, k, kw, hd, hp->eps);
			mcv_rope_apply(k, hp->n_rot, cosin);
		}
		store_f16(kc + (size_t)(slot0 + t) * nk, K + (size_t)t * nk, nk);
		store_f16(vc + (size_t)(slot0 + t) * nk, V + (size_t)t * nk, nk);
	}
}

/* One (row t, head h) of causal attention over the cache into O, gated;
 * sc: a score row of n_ctx floats owned by the caller's thread. */
void mcv_attn_head(mcv_ctx *c, const mcv_layer *L, int slot0, const float *Q, float *O, int t, int h,
		   float *sc)
{
	const mcv_hparams *hp = &c->m->hp;
	const int hd = hp->head_dim, nh = hp->n_head, nkv = hp->n_head_kv;
	const int nq = 2 * hd * nh, nk = hd * nkv;
	const size_t kv_layer = (size_t)L->kv_index * c->n_ctx * nk;
	const uint16_t *kc = c->kcache + kv_layer, *vc = c->vcache + kv_layer;
	const float scale = 1.0f / sqrtf((float)hd);
	const int g = h / (nh / nkv);
	const int n_kv = slot0 + t + 1; /* causal: cells up to this token */
	const float *q = Q + (size_t)t * nq + (size_t)h * 2 * hd;
	const float *gate = q + hd;
	float qr[hd];
	for (int d = 0; d < hd; d++)
		qr[d] = f16r(q[d]);
	float mx = -INFINITY;
	for (int j = 0; j < n_kv; j++) {
		sc[j] = dot_f16(kc + (size_t)j * nk + (size_t)g * hd, qr, hd) * scale;
		if (sc[j] > mx)
			mx = sc[j];
	}
	double sum = 0.0;
	for (int j = 0; j < n_kv; j++) {
		sc[j] = expf(sc[j] - mx);
		sum += sc[j];
	}
	const float inv = (float)(1.0 / sum);
	float *o = O + (size_t)t * hd * nh + (size_t)h * hd;
	memset(o, 0, sizeof(float) * hd);
	for (int j = 0; j < n_kv; j++)
		axpy_f16(o, vc + (size_t)j * nk + (size_t)g * hd, f16r(sc[j] * inv), hd);
	for (int d = 0; d < hd; d++)
		o[d] *= mcv_sigmoid(gate[d]);
}

void mcv_attn_forward(mcv_ctx *c, const mcv_layer *L, int nt, int slot0)
{
	const mcv_hparams *hp = &c->m->hp;
	const int H = hp->n_embd, hd = hp->head_dim, nh = hp->n_head, nkv = hp->n_head_kv;
	const int nq = 2 * hd * nh, nk = hd * nkv;
	float *Q = c->big[0], *K = c->big[1], *V = c->big[2], *O = c->big[3];
	mcv_act *act = nt == 1 ? &c->act : NULL;

	if (L->wqkv.data) {
		mcv_wt_mm(&L->wqkv, 0, nq, c->xn, nt, Q, act);
		mcv_wt_mm(&L->wqkv, nq, nk, c->xn, nt, K, act);
		mcv_wt_mm(&L->wqkv, nq + nk, nk, c->xn, nt, V, act);
	} else {
		mcv_wt_mm(&L->wq, 0, nq, c->xn, nt, Q, act);
		mcv_wt_mm(&L->wk, 0, nk, c->xn, nt, K, act);
		mcv_wt_mm(&L->wv, 0, nk, c->xn, nt, V, act);
	}

	const int par = nt > 1;
#pragma omp parallel for schedule(static) if (par)
	for (int t = 0; t < nt; t++)
		mcv_attn_prep(c, L, slot0, Q, K, V, t, t + 1);
#pragma omp parallel for schedule(dynamic, 1) if (par)
	for (int th = 0; th < nt * nh; th++)
		mcv_attn_head(c, L, slot0, Q, O, th / nh, th % nh,
			      c->scores + (size_t)omp_get_thread_num() * c->n_ctx);

	if (act)
		mcv_act_set(act, O, (int64_t)hd * nh);
	mcv_wt_mm(&L->wo, 0, H, O, nt, c->y, act);
}
