/* The vision tower's forward pass over one crop: patch embedding, learned
 * position table sampled per grid cell, ViT layers, the window-attention
 * merger (16x), and the 2x2 projector into the language model's width.
 * Mirrors scripts/ref/model.py VisionModel.forward step for step.
 *
 * This is the generic path: exact mode, and default mode where the fast
 * path (vision_fast.c: packed int8 products, bf16 attention, one parallel
 * region per crop) does not apply (other weight types, builds without
 * AVX-512 VNNI, MCV_VISION_FAST=0). */
#include "vision_impl.h"
#include "gemm.h"
#include "vision_kern.h"

#include <math.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

/* Below this many elements a parallel region costs more than it saves
 * (and much more on a loaded machine). */
#define PAR_MIN (1 << 16)
#define MAX_PATCHES (1 << 16)
#define ATT_QB 32 /* query rows of one attention task */

/* transposed keys, then one score block per thread */
static size_t attn_scratch(int n, int W)
{
#ifdef _OPENMP
	const size_t nt = (size_t)omp_get_max_threads();
#else
	const size_t nt = 1;
#endif
	return (size_t)n * W + nt * ATT_QB * (size_t)n;
}

/* MCV_VISION_PROF=1: wall milliseconds per stage, summed over encodes and
 * printed to stderr by mcv_vision_free (a profiling aid, not an API);
 * MCV_VISION_PROF=2: process CPU milliseconds instead. */
enum { PR_ALLOC, PR_PATCH, PR_POS, PR_LN, PR_QKV, PR_ATTN, PR_O, PR_UP, PR_GELU, PR_DOWN, PR_ADD,
       PR_MATT, PR_MDS, PR_PROJ, PR_N };
static const char *const pr_name[PR_N] = {"alloc", "patch", "pos", "layernorm", "qkv", "attention",
					   "attn_out", "ffn_up", "gelu", "ffn_down", "residual",
					   "merger_attn", "merger_ds", "projector"};
double mcv_vprof_ms[PR_N + 1];
int mcv_vprof_on = -1;
static double pr_t;
static double pr_now(void)
{
	struct timespec ts;
	/* 2: process CPU time (steadier on a shared machine) */
	clock_gettime(mcv_vprof_on == 2 ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}
#define PR(k) do { if (mcv_vprof_on > 0) { const double t_ = pr_now(); mcv_vprof_ms[k] += t_ - pr_t; pr_t = t_; } } while (0)
void mcv_vprof_report(void)
{
	if (mcv_vprof_on <= 0)
		return;
	double tot = 0;
	for (int i = 0; i < PR_N; i++)
		tot += mcv_vprof_ms[i];
	fprintf(stderr, "vision profile (%.0f encodes, ms total):", mcv_vprof_ms[PR_N]);
	for (int i = 0; i < PR_N; i++)
		fprintf(stderr, " %s %.1f (%.0f%%)", pr_name[i], mcv_vprof_ms[i], 100 * mcv_vprof_ms[i] / tot);
	fprintf(stderr, "\n");
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
		/* no decode path here to agree with bit for bit: the looser,
		 * faster product (one float step per block) */
		mcv_matmul_loose(w->type, w->data, w->rb, w->ne1, w->ne0, X, m, Y);
	}
	if (l->b.data) {
		const float *b = l->b.data;
		const int64_t n = w->ne1;
#pragma omp parallel for schedule(static) if (m * n > PAR_MIN)
		for (int64_t i = 0; i < m; i++)
			add_to(Y + i * n, b, n);
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
		const float mean = (float)(row_sum(x, n, 0, 0) / n);
		const float inv = (float)(1.0 / sqrt(row_sum(x, n, mean, 1) / n + eps));
		for (int64_t j = 0; j < n; j++)
			y[j] = (x[j] - mean) * inv * g[j] + b[j];
	}
}


/* Rows are split into fixed chunks, so the thread count only decides who
 * computes a chunk. */
#define GELU_CHUNK 4096
static void gelu_tanh(float *x, int64_t n)
{
	const int64_t nc = (n + GELU_CHUNK - 1) / GELU_CHUNK;
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
	for (int64_t c = 0; c < nc; c++) {
		const int64_t i0 = c * GELU_CHUNK;
		gelu_span(x + i0, n - i0 < GELU_CHUNK ? n - i0 : GELU_CHUNK);
	}
}

static void gelu_erf(float *x, int64_t n)
{
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
	for (int64_t i = 0; i < n; i++)
		x[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
}


/* Multi-head self-attention of all n rows (q, k, v are [n][W]) into a.
 * The keys are transposed once per head (kt[h][d][j]); then each task, a
 * head and a block of ATT_QB query rows, computes its scores, softmax and
 * output with gemm_nn in a private score block.  Tasks are fixed by n and
 * the head count, and each element is one thread's fixed computation, so
 * the thread count does not matter.  One parallel region per layer. */
static void attention_full(const enc *e, int n, const float *q, const float *k, const float *v,
			   float *a)
{
	const int W = e->v->width, nh = e->v->n_head, hd = W / nh;
	const float scale = 1.0f / sqrtf((float)hd);
	const int nqb = (n + ATT_QB - 1) / ATT_QB, ntask = nh * nqb;
	float *kt = e->sc;
#pragma omp parallel if ((int64_t)n * n * nh > PAR_MIN)
	{
#ifdef _OPENMP
		float *sc = kt + (size_t)n * W + (size_t)omp_get_thread_num() * ATT_QB * n;
#else
		float *sc = kt + (size_t)n * W;
#endif
#pragma omp for schedule(static)
		for (int j = 0; j < n; j++)
			for (int c = 0; c < W; c++)
				kt[(size_t)(c / hd) * hd * n + (size_t)(c % hd) * n + j] = k[(size_t)j * W + c];
#pragma omp for schedule(static)
		for (int t = 0; t < ntask; t++) {
			const int h = t / nqb, i0 = (t % nqb) * ATT_QB;
			const int m = n - i0 < ATT_QB ? n - i0 : ATT_QB;
			gemm_nn(m, n, hd, q + (size_t)i0 * W + h * hd, W, kt + (size_t)h * hd * n, n, sc, n);
			for (int i = 0; i < m; i++)
				softmax_row(sc + (size_t)i * n, n, scale);
			gemm_nn(m, hd, n, sc, n, v + h * hd, W, a + (size_t)i0 * W + h * hd, W);
		}
	}
}

static int vit_layer(const enc *e, const mcv_vit_layer *L, int n, mcv_error *err)
{
	const mcv_vision *v = e->v;
	const int W = v->width;
	int rc;
	layer_norm(&L->ln1, v->eps, e->x, n, W, e->h);
	PR(PR_LN);
	if ((rc = linear(e, &L->q, e->h, n, e->q, err)) < 0 ||
	    (rc = linear(e, &L->k, e->h, n, e->k, err)) < 0 ||
	    (rc = linear(e, &L->v, e->h, n, e->vv, err)) < 0)
		return rc;
	PR(PR_QKV);
	attention_full(e, n, e->q, e->k, e->vv, e->a);
	PR(PR_ATTN);
	if ((rc = linear(e, &L->o, e->a, n, e->h, err)) < 0)
		return rc;
	PR(PR_O);
	add_to(e->x, e->h, (int64_t)n * W);
	PR(PR_ADD);
	layer_norm(&L->ln2, v->eps, e->x, n, W, e->h);
	PR(PR_LN);
	if ((rc = linear(e, &L->up, e->h, n, e->ff, err)) < 0)
		return rc;
	PR(PR_UP);
	gelu_tanh(e->ff, (int64_t)n * v->ff);
	PR(PR_GELU);
	if ((rc = linear(e, &L->down, e->ff, n, e->h, err)) < 0)
		return rc;
	PR(PR_DOWN);
	add_to(e->x, e->h, (int64_t)n * W);
	PR(PR_ADD);
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
	add_to(e->x, e->h, (int64_t)n * W);
	PR(PR_MATT);
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
	PR(PR_MDS);
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
	if (mcv_vprof_on < 0)
		mcv_vprof_on = getenv("MCV_VISION_PROF") ? atoi(getenv("MCV_VISION_PROF")) : 0;
	if (v->fast && !(p && p->exact))
		return mcv_vision_fast_encode(v, chw, w, h, merge, out, err);
	int gh = h / P, gw = w / P;
	const int n0 = gh * gw;
	const int K = 3 * P * P;
	if (mcv_vprof_on < 0)
		mcv_vprof_on = getenv("MCV_VISION_PROF") ? atoi(getenv("MCV_VISION_PROF")) : 0;
	if (mcv_vprof_on > 0) {
		pr_t = pr_now();
		mcv_vprof_ms[PR_N] += 1;
	}
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
	e.sc = malloc(sizeof(float) * attn_scratch(n0, W));
	if (!e.x || !e.h || !e.q || !e.k || !e.vv || !e.a || !e.ff || !e.sc) {
		rc = mcv_error_set(err, MCV_ENOMEM, "out of memory encoding a %dx%d crop", w, h);
		goto done;
	}
	PR(PR_ALLOC);
	/* patch embedding: a P x P stride-P convolution as a product over patches */
	patch_embed(&e, chw, w, h, e.ff);
	{
		mcv_lin pl = {v->patch_w, v->patch_b};
		if ((rc = linear(&e, &pl, e.ff, n0, e.x, err)) < 0)
			goto done;
	}
	PR(PR_PATCH);
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
	PR(PR_POS);
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
	PR(PR_ALLOC);
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
	PR(PR_PROJ);
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
	PR(PR_ALLOC);
	return rc;
}
