/* The vision tower's forward pass over one crop: patch embedding, learned
 * position table sampled per grid cell, ViT layers, the window-attention
 * merger (16x), and the 2x2 projector into the language model's width.
 * Mirrors scripts/ref/model.py VisionModel.forward step for step. */
#include "vision_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Below this many elements a parallel region costs more than it saves
 * (and much more on a loaded machine). */
#define PAR_MIN (1 << 16)
#define MAX_PATCHES (1 << 16)
#define ATT_BLOCK 256 /* query rows whose scores are held at once */

static size_t attn_scratch(int n, int hd)
{
	const size_t qb = n < ATT_BLOCK ? n : ATT_BLOCK;
	return qb * hd + qb * n + (size_t)hd * n + qb * hd;
}

typedef struct enc {
	const mcv_vision *v;
	int exact;
	/* scratch */
	float *x, *h, *q, *k, *vv, *a, *ff, *sc;
} enc;

/* y = W x + b for m rows of X.  In exact mode the weights are dequantized
 * to f32 first so the product sees the same numbers as the reference. */
static int linear(const enc *e, const mcv_lin *l, const float *X, int64_t m, float *Y,
		  mcv_error *err)
{
	const mcv_vw *w = &l->w;
	if (e->exact && w->type != MCV_F32) {
		float *wf = malloc(sizeof(float) * (size_t)w->ne0 * (size_t)w->ne1);
		if (!wf)
			return mcv_error_set(err, MCV_ENOMEM, "out of memory for an f32 weight copy");
#pragma omp parallel for schedule(static)
		for (int64_t r = 0; r < w->ne1; r++)
			mcv_dequantize_row(w->type, (const char *)w->data + (size_t)r * w->rb,
					   wf + (size_t)r * w->ne0, w->ne0);
		mcv_matmul(MCV_F32, wf, sizeof(float) * (size_t)w->ne0, w->ne1, w->ne0, X, m, Y);
		free(wf);
	} else {
		mcv_matmul(w->type, w->data, w->rb, w->ne1, w->ne0, X, m, Y);
	}
	if (l->b.data) {
		const float *b = l->b.data;
		const int64_t n = w->ne1;
#pragma omp parallel for schedule(static) if (m * n > PAR_MIN)
		for (int64_t i = 0; i < m; i++)
			for (int64_t r = 0; r < n; r++)
				Y[i * n + r] += b[r];
	}
	return 0;
}

static void layer_norm(const mcv_ln *l, float eps, const float *X, int64_t m, int64_t n, float *Y)
{
	const float *g = l->w.data, *b = l->b.data;
#pragma omp parallel for schedule(static) if (m * n > PAR_MIN)
	for (int64_t i = 0; i < m; i++) {
		const float *x = X + i * n;
		float *y = Y + i * n;
		double s = 0;
		for (int64_t j = 0; j < n; j++)
			s += x[j];
		const float mean = (float)(s / n);
		double s2 = 0;
		for (int64_t j = 0; j < n; j++) {
			const double d = x[j] - mean;
			s2 += d * d;
		}
		const float inv = (float)(1.0 / sqrt(s2 / n + eps));
		for (int64_t j = 0; j < n; j++)
			y[j] = (x[j] - mean) * inv * g[j] + b[j];
	}
}

/* 0.5 u (1 + tanh(z)) written as u / (1 + exp(-2z)): the same function,
 * one expf instead of tanhf (which costs three times as much). */
static void gelu_tanh(float *x, int64_t n)
{
	const float c2 = 2.0f * 0.7978845608028654f; /* 2 sqrt(2/pi) */
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
	for (int64_t i = 0; i < n; i++) {
		const float u = x[i];
		x[i] = u / (1.0f + expf(-c2 * (u + 0.044715f * u * u * u)));
	}
}

static void gelu_erf(float *x, int64_t n)
{
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
	for (int64_t i = 0; i < n; i++)
		x[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
}

static void softmax_row(float *s, int n, float scale)
{
	float mx = -INFINITY;
	for (int j = 0; j < n; j++) {
		s[j] *= scale;
		if (s[j] > mx)
			mx = s[j];
	}
	double sum = 0;
	for (int j = 0; j < n; j++) {
		s[j] = expf(s[j] - mx);
		sum += s[j];
	}
	const float inv = (float)(1.0 / sum);
	for (int j = 0; j < n; j++)
		s[j] *= inv;
}

/* Multi-head self-attention of all n rows (q, k, v are [n][W]) into a.
 * Per head and block of query rows: scores by the f32 product kernel (the
 * keys serve as weight rows), softmax, then the values transposed serve as
 * weight rows for the output.  Every element is computed by one thread in
 * a fixed order, so the thread count does not matter. */
static void attention_full(const enc *e, int n, const float *q, const float *k, const float *v,
			   float *a)
{
	const int W = e->v->width, nh = e->v->n_head, hd = W / nh;
	const float scale = 1.0f / sqrtf((float)hd);
	const int qb = n < ATT_BLOCK ? n : ATT_BLOCK;
	float *qh = e->sc, *sc = qh + (size_t)qb * hd, *vt = sc + (size_t)qb * n, *oh = vt + (size_t)hd * n;
	for (int h = 0; h < nh; h++) {
#pragma omp parallel for schedule(static) if ((int64_t)n * hd > PAR_MIN)
		for (int j = 0; j < n; j++)
			for (int d = 0; d < hd; d++)
				vt[(size_t)d * n + j] = v[(size_t)j * W + h * hd + d];
		for (int i0 = 0; i0 < n; i0 += qb) {
			const int m = n - i0 < qb ? n - i0 : qb;
			for (int i = 0; i < m; i++)
				memcpy(qh + (size_t)i * hd, q + (size_t)(i0 + i) * W + h * hd, sizeof(float) * hd);
			mcv_matmul(MCV_F32, k + h * hd, sizeof(float) * W, n, hd, qh, m, sc);
#pragma omp parallel for schedule(static) if ((int64_t)m * n > PAR_MIN)
			for (int i = 0; i < m; i++)
				softmax_row(sc + (size_t)i * n, n, scale);
			mcv_matmul(MCV_F32, vt, sizeof(float) * n, hd, n, sc, m, oh);
			for (int i = 0; i < m; i++)
				memcpy(a + (size_t)(i0 + i) * W + h * hd, oh + (size_t)i * hd, sizeof(float) * hd);
		}
	}
}

static int vit_layer(const enc *e, const mcv_vit_layer *L, int n, mcv_error *err)
{
	const mcv_vision *v = e->v;
	const int W = v->width;
	int rc;
	layer_norm(&L->ln1, v->eps, e->x, n, W, e->h);
	if ((rc = linear(e, &L->q, e->h, n, e->q, err)) < 0 ||
	    (rc = linear(e, &L->k, e->h, n, e->k, err)) < 0 ||
	    (rc = linear(e, &L->v, e->h, n, e->vv, err)) < 0)
		return rc;
	attention_full(e, n, e->q, e->k, e->vv, e->a);
	if ((rc = linear(e, &L->o, e->a, n, e->h, err)) < 0)
		return rc;
	for (size_t i = 0; i < (size_t)n * W; i++)
		e->x[i] += e->h[i];
	layer_norm(&L->ln2, v->eps, e->x, n, W, e->h);
	if ((rc = linear(e, &L->up, e->h, n, e->ff, err)) < 0)
		return rc;
	gelu_tanh(e->ff, (int64_t)n * v->ff);
	if ((rc = linear(e, &L->down, e->ff, n, e->h, err)) < 0)
		return rc;
	for (size_t i = 0; i < (size_t)n * W; i++)
		e->x[i] += e->h[i];
	return 0;
}

/* Grid index of token t (0..3, row-major inside the window) of window (wy, wx). */
static inline int win_cell(int gw, int wy, int wx, int t)
{
	return (2 * wy + (t >> 1)) * gw + 2 * wx + (t & 1);
}

/* Rows of the 2x2 windows concatenated: out[wy * gw/2 + wx] = [x(0,0) x(0,1) x(1,0) x(1,1)]. */
static void gather_windows(const float *x, int gh, int gw, int W, float *out)
{
	const int nwx = gw / 2, nwin = (gh / 2) * nwx;
#pragma omp parallel for schedule(static)
	for (int wi = 0; wi < nwin; wi++)
		for (int t = 0; t < 4; t++)
			memcpy(out + ((size_t)wi * 4 + t) * W,
			       x + (size_t)win_cell(gw, wi / nwx, wi % nwx, t) * W, sizeof(float) * W);
}

/* Window attention over 2x2 windows, then the 2x2 downsample MLP plus the
 * windows' mean: gh x gw rows of e->x become gh/2 x gw/2. */
static int merger(const enc *e, int gh, int gw, mcv_error *err)
{
	const mcv_vision *v = e->v;
	const mcv_merger *M = &v->merger;
	const int W = v->width, nh = v->n_head, hd = W / nh, n = gh * gw;
	const int nwx = gw / 2, nwin = n / 4;
	const float scale = 1.0f / sqrtf((float)hd);
	int rc;
	layer_norm(&M->ln1, v->eps, e->x, n, W, e->h);
	if ((rc = linear(e, &M->q, e->h, n, e->q, err)) < 0 ||
	    (rc = linear(e, &M->k, e->h, n, e->k, err)) < 0 ||
	    (rc = linear(e, &M->v, e->h, n, e->vv, err)) < 0)
		return rc;
#pragma omp parallel for schedule(static)
	for (int wi = 0; wi < nwin; wi++) {
		int cell[4];
		for (int t = 0; t < 4; t++)
			cell[t] = win_cell(gw, wi / nwx, wi % nwx, t);
		for (int h = 0; h < nh; h++) {
			for (int i = 0; i < 4; i++) {
				const float *qi = e->q + (size_t)cell[i] * W + h * hd;
				float s[4];
				for (int j = 0; j < 4; j++) {
					const float *kj = e->k + (size_t)cell[j] * W + h * hd;
					float d = 0;
					for (int c = 0; c < hd; c++)
						d += qi[c] * kj[c];
					s[j] = d;
				}
				softmax_row(s, 4, scale);
				float *ai = e->a + (size_t)cell[i] * W + h * hd;
				for (int c = 0; c < hd; c++) {
					float acc = 0;
					for (int j = 0; j < 4; j++)
						acc += s[j] * e->vv[(size_t)cell[j] * W + h * hd + c];
					ai[c] = acc;
				}
			}
		}
	}
	if ((rc = linear(e, &M->o, e->a, n, e->h, err)) < 0)
		return rc;
	for (size_t i = 0; i < (size_t)n * W; i++)
		e->x[i] += e->h[i];
	/* downsample: cat (4W) -> ds_ln -> up -> gelu -> down, plus the mean */
	float *cat = e->q; /* n * W floats = nwin * 4W */
	gather_windows(e->x, gh, gw, W, cat);
	layer_norm(&M->ds_ln, v->eps, cat, nwin, 4 * W, e->a);
	if ((rc = linear(e, &M->ds_up, e->a, nwin, e->ff, err)) < 0)
		return rc;
	gelu_tanh(e->ff, (int64_t)nwin * v->merger_ff);
	if ((rc = linear(e, &M->ds_down, e->ff, nwin, e->h, err)) < 0)
		return rc;
#pragma omp parallel for schedule(static)
	for (int wi = 0; wi < nwin; wi++) {
		const float *p = cat + (size_t)wi * 4 * W;
		for (int c = 0; c < W; c++) {
			const float mean = (p[c] + p[W + c] + p[2 * W + c] + p[3 * W + c]) * 0.25f;
			e->x[(size_t)wi * W + c] = mean + e->h[(size_t)wi * W + c];
		}
	}
	return 0;
}

static void patch_embed(const enc *e, const float *chw, int w, int h, float *cols)
{
	const mcv_vision *v = e->v;
	const int P = v->patch, gw = w / P, gh = h / P, K = 3 * P * P;
#pragma omp parallel for schedule(static)
	for (int i = 0; i < gh * gw; i++) {
		const int py = i / gw, px = i % gw;
		float *row = cols + (size_t)i * K;
		for (int c = 0; c < 3; c++)
			for (int ky = 0; ky < P; ky++)
				memcpy(row + (c * P + ky) * P,
				       chw + (size_t)c * w * h + (size_t)(py * P + ky) * w + px * P,
				       sizeof(float) * P);
	}
}

int mcv_vision_encode_crop(const mcv_vision *v, const float *chw, int w, int h,
			   const mcv_vision_params *p, float *out, mcv_error *err)
{
	int merge, ms, rc;
	if ((rc = mcv_vision_resolve(v, p, &merge, &ms, err)) < 0)
		return rc;
	const int P = v->patch, W = v->width, m = P * merge;
	if (w < m || h < m || w % m || h % m || w > 16384 || h > 16384)
		return mcv_error_set(err, MCV_EINVAL, "crop %dx%d: sides must be positive multiples of %d",
				     w, h, m);
	/* crops are about image_size^2 (slicing keeps them so); a bound keeps a
	 * hostile image_size from asking for absurd scratch */
	if ((int64_t)(w / P) * (h / P) > MAX_PATCHES)
		return mcv_error_set(err, MCV_ENOMEM, "crop %dx%d has more than %d patches", w, h, MAX_PATCHES);
	int gh = h / P, gw = w / P;
	const int n0 = gh * gw;
	const int K = 3 * P * P;
	enc e = {.v = v, .exact = p ? p->exact : 0};
	const int ffmax = v->ff > v->merger_ff ? v->ff : v->merger_ff;
	const size_t nW = (size_t)n0 * W;
	size_t big = (size_t)n0 * (ffmax > K ? ffmax : K);
	if ((size_t)(n0 / 4) * v->proj_ff > big)
		big = (size_t)(n0 / 4) * v->proj_ff;
	e.x = malloc(sizeof(float) * nW);
	e.h = malloc(sizeof(float) * nW);
	e.q = malloc(sizeof(float) * nW);
	e.k = malloc(sizeof(float) * nW);
	e.vv = malloc(sizeof(float) * nW);
	e.a = malloc(sizeof(float) * nW);
	e.ff = malloc(sizeof(float) * big);
	e.sc = malloc(sizeof(float) * attn_scratch(n0, W / v->n_head));
	if (!e.x || !e.h || !e.q || !e.k || !e.vv || !e.a || !e.ff || !e.sc) {
		rc = mcv_error_set(err, MCV_ENOMEM, "out of memory encoding a %dx%d crop", w, h);
		goto done;
	}
	/* patch embedding: a P x P stride-P convolution as a product over patches */
	patch_embed(&e, chw, w, h, e.ff);
	{
		mcv_lin pl = {v->patch_w, v->patch_b};
		if ((rc = linear(&e, &pl, e.ff, n0, e.x, err)) < 0)
			goto done;
	}
	/* the learned nb x nb position table sampled at floor(nb * i / g) */
	{
		const int nb = v->pos_buckets;
#pragma omp parallel for schedule(static)
		for (int i = 0; i < n0; i++) {
			const int by = nb * (i / gw) / gh, bx = nb * (i % gw) / gw;
			float *row = e.a + (size_t)i * W;
			mcv_dequantize_row(v->pos.type, (const char *)v->pos.data + (size_t)(by * nb + bx) * v->pos.rb,
					   row, W);
			for (int c = 0; c < W; c++)
				e.x[(size_t)i * W + c] += row[c];
		}
	}
	int n = n0;
	if (merge == 4) {
		for (int il = 0; il <= v->insert_layer; il++)
			if ((rc = vit_layer(&e, &v->layers[il], n, err)) < 0)
				goto done;
		if ((rc = merger(&e, gh, gw, err)) < 0)
			goto done;
		gh /= 2;
		gw /= 2;
		n = gh * gw;
		for (int il = v->insert_layer + 1; il < v->n_layer; il++)
			if ((rc = vit_layer(&e, &v->layers[il], n, err)) < 0)
				goto done;
	} else {
		for (int il = 0; il < v->n_layer; il++)
			if ((rc = vit_layer(&e, &v->layers[il], n, err)) < 0)
				goto done;
	}
	layer_norm(&v->post_ln, v->eps, e.x, n, W, e.h);
	/* projector: 2x2 windows concatenated -> LayerNorm -> up -> GELU (erf) -> down */
	{
		const int nwin = n / 4;
		gather_windows(e.h, gh, gw, W, e.q);
		layer_norm(&v->mm_norm, v->eps, e.q, nwin, 4 * W, e.a);
		if ((rc = linear(&e, &v->mm_up, e.a, nwin, e.ff, err)) < 0)
			goto done;
		gelu_erf(e.ff, (int64_t)nwin * v->proj_ff);
		if ((rc = linear(&e, &v->mm_down, e.ff, nwin, out, err)) < 0)
			goto done;
	}
	rc = 0;
done:
	free(e.x);
	free(e.h);
	free(e.q);
	free(e.k);
	free(e.vv);
	free(e.a);
	free(e.ff);
	free(e.sc);
	return rc;
}
