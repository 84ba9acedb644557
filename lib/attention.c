/* Full (gated) attention layer of qwen35: one projection gives per head the
 * query and an output gate; Q and K are RMS-normed per head, rotated with
 * interleaved M-RoPE on the first n_rot dims, and attend causally over an
 * fp16 KV cache with GQA (query head h reads KV head h / (n_head/n_head_kv)).
 *
 * Rounding follows llama.cpp's CPU path without flash attention, bit for
 * bit on an AVX-512 machine: K and V are stored as fp16, the query is
 * rounded to fp16 for the QK dot, the softmax exponentials are ggml's
 * (mcv_exp_shifted), and the softmax weights are rounded to fp16 before
 * they weight V.  Its two products sum in the order of the kernel it picks
 * (see head_dot).  The steps are functions over rows / (row, head) pairs,
 * shared with lib/prefill.c. */
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

/* GCC's _mm512_reduce_add_ps over 16 lanes, as ggml's kernels end: the
 * halves added, then their halves, then pairs. */
static inline float hsum16(const float *a)
{
	float t[8], u[4];
	for (int i = 0; i < 8; i++)
		t[i] = a[i + 8] + a[i];
	for (int i = 0; i < 4; i++)
		u[i] = t[i + 4] + t[i];
	return (u[0] + u[2]) + (u[1] + u[3]);
}

/* The orders of llama.cpp's two attention products (KQ over the head's
 * dims, KQV over the cells).  A batch of two or more tokens goes through
 * its tiled GEMM (whose cells are padded to a multiple of 256, so both
 * sums qualify when the head size is a multiple of 16): one 16-lane
 * accumulator per output, element i of the sum in lane i % 16, fused
 * multiply-adds, one horizontal sum.  A single token goes through its
 * F16 vec_dot: element i in accumulator (i % 64) / 16, lane i % 16, the
 * four folded (a0 + a2) + (a1 + a3) before the horizontal sum; elements
 * past the last whole 64 (only in KQ) are added one by one in double.
 * Cells past the causal end weigh 0 there and are left out here. */
enum { ORD_TILED, ORD_VEC };

/* k . q over n dims, k in fp16, q already rounded to fp16 */
static float head_dot(int ord, const uint16_t *k, const float *q, int n)
{
	float acc[4][16] = { { 0 } };
	if (ord == ORD_TILED) {
		for (int i = 0; i < n; i++)
			acc[0][i % 16] = fmaf(mcv_fp16_to_fp32(k[i]), q[i], acc[0][i % 16]);
		return hsum16(acc[0]);
	}
	const int np = n & ~63;
	for (int i = 0; i < np; i++)
		acc[(i % 64) / 16][i % 16] = fmaf(mcv_fp16_to_fp32(k[i]), q[i], acc[(i % 64) / 16][i % 16]);
	float x[16];
	for (int l = 0; l < 16; l++)
		x[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
	double s = hsum16(x);
	for (int i = np; i < n; i++)
		s += (double)(mcv_fp16_to_fp32(k[i]) * q[i]);
	return (float)s;
}

/* o[d] = sum over cells j < n of w[j] v_j[d] (v rows of hd halves, stride
 * nk; w already rounded to fp16); A: scratch of 64 * hd floats. */
static void head_weigh(int ord, const uint16_t *v, size_t nk, const float *w, int n, int hd, float *A,
		       float *o)
{
	const int nacc = ord == ORD_TILED ? 16 : 64;
	memset(A, 0, sizeof(float) * (size_t)nacc * hd);
	float vf[hd];
	for (int j = 0; j < n; j++) {
		for (int d = 0; d < hd; d++)
			vf[d] = mcv_fp16_to_fp32(v[(size_t)j * nk + d]);
		float *a = A + (size_t)(ord == ORD_TILED ? j % 16 : j % 64) * hd;
		const float wj = w[j];
#pragma omp simd
		for (int d = 0; d < hd; d++)
			a[d] = fmaf(vf[d], wj, a[d]);
	}
	for (int d = 0; d < hd; d++) {
		float x[16];
		for (int l = 0; l < 16; l++)
			x[l] = ord == ORD_TILED ? A[(size_t)l * hd + d]
					       : (A[(size_t)l * hd + d] + A[(size_t)(32 + l) * hd + d]) +
							 (A[(size_t)(16 + l) * hd + d] + A[(size_t)(48 + l) * hd + d]);
		o[d] = hsum16(x);
	}
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

/* One (row t, head h) of causal attention over the cache into O, gated,
 * for a batch of nt tokens (which decides the products' order); sc: this
 * thread's scratch of mcv_attn_scratch floats. */
void mcv_attn_head(mcv_ctx *c, const mcv_layer *L, int slot0, const float *Q, float *O, int t, int h, int nt,
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
	const int batch = nt >= 2 && !mcv_f32_single();
	const int ord_kq = batch && hd % 16 == 0 ? ORD_TILED : ORD_VEC;
	const int ord_kqv = batch && hd % 4 == 0 ? ORD_TILED : ORD_VEC;
	const float *q = Q + (size_t)t * nq + (size_t)h * 2 * hd;
	const float *gate = q + hd;
	float qr[hd];
	for (int d = 0; d < hd; d++)
		qr[d] = f16r(q[d]);
	float mx = -INFINITY;
	for (int j = 0; j < n_kv; j++) {
		sc[j] = head_dot(ord_kq, kc + (size_t)j * nk + (size_t)g * hd, qr, hd) * scale;
		if (sc[j] > mx)
			mx = sc[j];
	}
	/* masked cells up to the next 16: ggml's exponentials run 16 at a time */
	const int n16 = (n_kv + 15) & ~15;
	for (int j = n_kv; j < n16; j++)
		sc[j] = -INFINITY;
	const float inv = (float)(1.0 / mcv_exp_shifted(sc, sc, n16, mx));
	for (int j = 0; j < n_kv; j++)
		sc[j] = f16r(sc[j] * inv);
	float *o = O + (size_t)t * hd * nh + (size_t)h * hd;
	head_weigh(ord_kqv, vc + (size_t)g * hd, (size_t)nk, sc, n_kv, hd, sc + c->n_ctx + 16, o);
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
		mcv_attn_head(c, L, slot0, Q, O, th / nh, th % nh, nt,
			      c->scores + (size_t)omp_get_thread_num() * c->score_stride);

	if (act)
		mcv_act_set(act, O, (int64_t)hd * nh);
	mcv_wt_mm(&L->wo, 0, H, O, nt, c->y, act);
}
